"""Every user mistake, through the real `tracerl` command: exit status 2, one or two lines
saying what, where and what to do, no traceback, no model loaded, and nothing written to an
existing run directory."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.command import run_tracerl
from tests.env_sources import LOSES_ITS_DATABASE
from tests.ownpkg import write_package, write_rows

BASE = {
    "name": "existing",
    "model": {"spec": "smollm2-135m-instruct"},  # loading it would fill the empty cache
    "env": {"name": "search", "kwargs": {"corpus": "synthetic"}},
}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli-errors")
    site = write_package(root, dist_info=False)
    runs = root / "runs"
    existing = runs / "existing"
    existing.mkdir(parents=True)
    (existing / "metrics.jsonl").write_text('{"step": 0, "phase": "train"}\n')
    (existing / "config.yaml").write_text("name: existing\n")
    good = site / "good.yaml"
    good.write_text(yaml.safe_dump({**BASE, "out_dir": str(runs)}))
    (site / "broken.yaml").write_text("name: x\ntrainer:\n  steps: [1\n")
    (site / "twice.yaml").write_text("name: x\ntrainer: {steps: 1}\ntrainer: {lr: 0.1}\n")
    (site / "empty.yaml").write_text("# nothing yet\n")
    (site / "typo.yaml").write_text(
        yaml.safe_dump({**BASE, "out_dir": str(runs)}) + "trainr:\n  steps: 2\n"
    )
    (site / "faulty.py").write_text(FAULTY)
    good_row = {"id": "a", "split": "train", "value": 1.0, "from_unit": "km", "to_unit": "m"}
    write_rows(site / "rows.jsonl", [{**good_row, "expected": 1000.0}, {**good_row, "id": "b"}])
    return {"site": site, "runs": runs, "existing": existing}


FAULTY = (
    """
from tracerl.envs.arithmetic import Arithmetic


class ResetRaises(Arithmetic):
    async def reset(self, task, seed):
        raise ConnectionError("database at db:5432 unreachable")


def says_yes(completion):
    return "yes"
"""
    + LOSES_ITS_DATABASE
)

# (command line, what the first line must say, what the second must say: None = no hint)
CASES = {
    "malformed yaml": (["train", "broken.yaml"], "broken.yaml:4:1: invalid YAML", "fix the file"),
    "unknown key in a file": (
        ["train", "typo.yaml"],
        "typo.yaml:LINE: unknown key 'trainr'; did you mean 'trainer'?",
        "valid keys of the top level",
    ),
    "unknown key in an override": (
        ["train", "good.yaml", "trainer.lrr=1e-5"],
        "unknown key 'trainer.lrr'; did you mean 'trainer.lr'?",
        "valid keys of trainer",
    ),
    "override with a bad type": (
        ["train", "good.yaml", "trainer.lr=fast"],
        "override 'trainer.lr=fast': trainer.lr: Input should be a valid number",
        "docs/config.md",
    ),
    "unknown model spec": (
        ["train", "good.yaml", "model.spec=smollm3"],
        "model.spec: unknown model spec 'smollm3'",
        "hf:<folder>",
    ),
    "unknown environment": (
        ["train", "good.yaml", "env.name=unitconv"],
        "env.name: unknown environment 'unitconv'; registered: arithmetic",
        "tracerl init NAME",
    ),
    "unknown reward": (
        ["train", "good.yaml", "trainer.reward=vibes"],
        "trainer.reward: unknown reward 'vibes'",
        "package.module:function",
    ),
    "a reward module that is not there": (
        ["train", "good.yaml", "trainer.reward=mypkg.rewards:unit"],
        "no module named 'mypkg'",
        "pip install -e",
    ),
    "a split the environment lacks": (
        ["train", "good.yaml", "env.eval_split=test"],
        "env.eval_split: environment 'search' has no split 'test'; its splits: train, heldout",
        "set env.eval_split",
    ),
    "a combination the run cannot complete": (
        ["train", "good.yaml", "env.kwargs.corpus=wiki", "env.adversarial_eval_tasks=4"],
        "asks for the 'adversarial' split",
        "env.adversarial_eval_tasks: 0",
    ),
    "an environment argument it does not take": (
        ["train", "good.yaml", "env.kwargs.corpuss=wiki"],
        "env.kwargs: SearchEnv.__init__() got an unexpected keyword argument 'corpuss'",
        "check the arguments",
    ),
    "a dataset row missing a field": (
        [
            "train",
            "good.yaml",
            "env.name=unitpkg.envs:UnitConv",
            "env.kwargs={data: rows.jsonl}",
            "trainer.reward=unitpkg.rewards:within_tolerance",
        ],
        "rows.jsonl:2: the row has no 'expected' field",
        "add the field to that line of rows.jsonl",
    ),
    "an agent module that is not there": (
        ["train", "good.yaml", "agent=mypkg.agent:solve"],
        "agent: agent 'mypkg.agent:solve': no module named 'mypkg'",
        "pip install -e",
    ),
    "an agent on Ray rollout workers": (
        ["train", "good.yaml", "agent=mypkg.agent:solve", "trainer.rollout.backend=ray"],
        "trainer.rollout.backend=ray is not supported with it",
        None,
    ),
    "missing config file": (["train", "nope.yaml"], "nope.yaml: no such config file", None),
    "a key twice": (
        ["train", "twice.yaml"],
        "twice.yaml:3: key 'trainer' again (first at line 2)",
        "merge the two",
    ),
    "an empty config": (["train", "empty.yaml"], "empty.yaml: the file is empty", "name: myrun"),
    "a run name that is a path": (["train", "good.yaml", "name=../elsewhere"], "name:", None),
    "a reward asking for what no task has": (
        [
            "train",
            "good.yaml",
            "env.name=unitpkg.envs:UnitConv",
            "env.kwargs={}",
            "trainer.reward=unitpkg.rewards:needs_gold",
        ],
        "cannot pass parameter(s) 'gold'",
        "give it a default",
    ),
    "an environment whose reset always raises": (
        ["train", "good.yaml", "name=fresh", "env.name=faulty:ResetRaises", "env.kwargs={}"],
        "env.name: environment 'faulty:ResetRaises' failed its first episode (task ",
        "every episode would be the environment's",
    ),
    "a reward that returns a string": (
        [
            "train",
            "good.yaml",
            "name=fresh",
            "env.name=arithmetic",
            "env.kwargs={}",
            "trainer.reward=faulty:says_yes",
        ],
        "trainer.reward: the reward could not score an episode",
        "every episode would be the evaluator's",
    ),
    "eval of a config whose environment cannot reset": (
        ["eval", "good.yaml", "env.name=faulty:ResetRaises", "env.kwargs={}", "--out", "RUNS/ev"],
        "ConnectionError: database at db:5432 unreachable",
        None,
    ),
    "resuming a run that is not there": (
        ["train", "good.yaml", "name=never-started", "--resume"],
        "no run to resume",
        "without --resume",
    ),
    "resuming with another config": (
        ["train", "good.yaml", "--resume"],
        "was started with another config",
        "changing only how it runs",
    ),
    "eval with a corpus that has no questions": (
        ["eval", "--corpus", "wikx", "--out", "RUNS/new-eval"],
        "--corpus 'wikx'",
        None,
    ),
    "eval of a config given a search-only option": (
        ["eval", "good.yaml", "--model", "tiny-random", "--out", "RUNS/new-eval"],
        "--model apply only without a CONFIG",
        "model.spec=",
    ),
    "check-env with an argument the env does not take": (
        ["check-env", "unitpkg.envs:UnitConv", "--arg", "foo=1"],
        "--arg: UnitConv.__init__() got an unexpected keyword argument 'foo'",
        "(data, side_effect_guard)",
    ),
    "check-env of an env whose data file is bad": (
        ["check-env", "unitpkg.envs:UnitConv", "--arg", "data=rows.jsonl"],
        "rows.jsonl:2: the row has no 'expected' field",
        None,
    ),
    "show of a file that holds no trajectories": (
        ["show", "good.yaml"],
        "is not a JSON-lines file",
        None,
    ),
    "sft with a learning rate below zero": (
        ["sft", "RUNS/existing", "--out", "m", "--lr", "-1"],
        "--lr must be above 0",
        None,
    ),
    "the run exists": (["train", "good.yaml"], "already holds a run", "--resume"),
    "eval of a run that is not there": (
        ["eval", "good.yaml", "model.spec=run:RUNS/nope@3", "--out", "RUNS/new-eval"],
        "model.spec: run:",
        "give a run's folder",
    ),
    "eval of a run that has no checkpoint": (
        ["eval", "good.yaml", "model.spec=run:RUNS/existing", "--out", "RUNS/new-eval"],
        "no checkpoint under",
        "train the run first",
    ),
    "eval at a negative temperature": (
        ["eval", "good.yaml", "eval.temperature=-0.5", "--out", "RUNS/new-eval"],
        "eval.temperature: Input should be greater than or equal to 0",
        "docs/config.md",
    ),
    "eval of a config naming an unknown env": (
        ["eval", "good.yaml", "env.name=nope", "--out", "RUNS/new-eval"],
        "unknown environment 'nope'",
        None,
    ),
    "readiness of a config with a bad key": (
        ["readiness", "good.yaml", "trainer.stepz=3"],
        "did you mean 'trainer.steps'?",
        None,
    ),
    "check-env with neither an environment nor a config": (
        ["check-env"],
        "check-env: name an environment, or give --config FILE",
        None,
    ),
    "check-env of a name and a config that disagree": (
        ["check-env", "refund_desk", "--config", "good.yaml"],
        "name different environments",
        "give one of them",
    ),
    "check-env of an unknown environment": (
        ["check-env", "unitcon"],
        "unknown environment 'unitcon'",
        "package.module:Class",
    ),
    "check-env of a class that is not there": (
        ["check-env", "unitpkg.envs:UnitConverter"],
        "has no attribute 'UnitConverter'",
        None,
    ),
    "show of an episode the run lacks": (["show", "RUNS/existing", "ep-1"], "ep-1", None),
    "replay of a run that does not exist": (
        ["replay", "RUNS/missing", "--episode", "x"],
        "missing",
        None,
    ),
    "load-model of an unknown spec": (["load-model", "gpt-5"], "unknown model spec", None),
    "export of a run that does not exist": (
        ["export", "RUNS/missing", "--out", "exported"],
        "there is no run at",
        "give a run's folder",
    ),
    "sft on a missing file": (["sft", "nope.jsonl", "--out", "m"], "nope.jsonl", None),
    "replay without an episode": (
        ["replay", "RUNS/existing"],
        "replay: name one episode: tracerl replay RUN EPISODE",
        "tracerl triage RUN",
    ),
    # a folder that holds runs is not one: its episodes are never merged into one report
    "triage of a folder holding runs": (
        ["triage", "RUNS"],
        "runs: not a run directory (one has metrics.jsonl, config.yaml and episodes/ in it)",
        "existing): pass one",
    ),
    "report of a folder holding runs": (
        ["report", "RUNS", "--n", "5"],
        "runs: not a run directory (one has metrics.jsonl, config.yaml and episodes/ in it)",
        "existing): pass one",
    ),
    "show of an episode in a folder holding runs": (
        ["show", "RUNS", "ep-1"],
        "runs: not a run directory",
        "existing): pass one",
    ),
    "triage of a folder that holds no run": (
        ["triage", "."],
        ".: not a run directory",
        "pass a folder written by `tracerl train`, `tracerl eval` or `tracerl demo`",
    ),
}


def _tracerl(args: list[str], cwd: Path, cache: Path, *extra: str):
    return run_tracerl([*extra, *args], cwd, cache)


def _tree(path: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(path)): (p.stat().st_mtime_ns, p.stat().st_size)
        for p in sorted(path.rglob("*"))
    }


@pytest.mark.parametrize("case", list(CASES))
def test_a_mistake_is_two_lines_exit_2_and_changes_nothing(case, world, tmp_path):
    args, first, second = CASES[case]
    args = [a.replace("RUNS", str(world["runs"])) for a in args]
    typo = (world["site"] / "typo.yaml").read_text().splitlines().index("trainr:") + 1
    first = first.replace("LINE", str(typo))
    before = _tree(world["runs"])
    cache = tmp_path / "cache"
    cache.mkdir()
    r = _tracerl(args, world["site"], cache)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr + r.stdout
    assert 1 <= len(lines) <= 2, r.stderr
    assert lines[0].startswith("error: ") and first in lines[0], lines
    if second is not None:
        assert len(lines) == 2 and second in lines[1], lines
    assert _tree(world["runs"]) == before  # nothing written, nothing touched
    assert not any(cache.iterdir()), "a model or tokenizer was loaded before the error"


IMPORTS = """
import sys
from tracerl.cli import app
sys.argv = ["tracerl", *sys.argv[1:]]
try:
    app()
except SystemExit as e:
    heavy = sorted({m.split(".")[0] for m in sys.modules} & {"torch", "transformers", "numpy"})
    print()
    print("exit", e.code, *heavy)
"""

# mistakes found only by running the environment's first episode or building its search
# index: told after the model stack loads
LOADS_FIRST = {
    "an environment whose reset always raises",
    "a reward that returns a string",
    "eval of a config whose environment cannot reset",
    "eval with a corpus that has no questions",
}


@pytest.mark.parametrize("case", [c for c in CASES if c not in LOADS_FIRST])
def test_a_mistake_in_a_config_is_told_before_the_model_stack_loads(case, world, tmp_path):
    """Checking a config (its keys, environment, reward, model spec) needs no torch: its
    mistakes are told in under a second, not after the seconds torch takes to import."""
    args = [a.replace("RUNS", str(world["runs"])) for a in CASES[case][0]]
    env = {**os.environ, "TRACERL_CACHE": str(tmp_path)}
    r = subprocess.run(
        [sys.executable, "-c", IMPORTS, *args],
        cwd=world["site"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    verdict = r.stdout.splitlines()[-1].split()
    assert verdict == ["exit", "2"], (r.stdout, r.stderr)  # none of them imported
    assert r.stderr.startswith("error: ")


def test_bare_train_prints_usage_and_the_configs_found_and_starts_nothing(world, tmp_path):
    (world["site"] / "configs").mkdir(exist_ok=True)
    (world["site"] / "configs" / "mine.yaml").write_text("name: mine\n")
    before = _tree(world["site"])
    r = _tracerl(["train"], world["site"], tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.startswith("usage: tracerl train CONFIG") and "Traceback" not in r.stderr
    assert "configs/mine.yaml" in r.stderr
    assert _tree(world["site"]) == before and not (world["site"] / "runs" / "run").exists()


def test_debug_shows_the_traceback(world, tmp_path):
    r = _tracerl(["train", "good.yaml", "env.name=unitconv"], world["site"], tmp_path, "--debug")
    assert r.returncode != 0 and "Traceback" in r.stderr and "unknown environment" in r.stderr


def test_help_lists_every_command_in_whole_sentences_and_the_readme_names_them():
    from typer.testing import CliRunner

    from tracerl.cli import app

    out = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"}).output
    rows = [line.strip("│ ").split(None, 1) for line in out.splitlines() if "│ " in line]
    commands = {r[0]: r[1].strip(" │") for r in rows if len(r) == 2 and not r[0].startswith("-")}
    assert {"init", "train", "eval", "review", "check-env", "replay"} <= set(commands)
    for name, text in commands.items():  # one whole sentence, not a line cut mid-way
        assert text.endswith((".", "?", ")")), (name, text)
    assert "async" in commands["train"]
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    for name in commands:
        assert f"`{name}" in readme, f"README.md does not mention `tracerl {name}`"
    # options read as in other tools: no type on a flag, upper-case names for values
    for args in (["--help"], ["train", "--help"], ["sft", "--help"], ["serve", "--help"]):
        out = CliRunner().invoke(app, args, env={"COLUMNS": "200"}).output
        assert "<bool>" not in out and "<str>" not in out, (args, out)
    sft = CliRunner().invoke(app, ["sft", "--help"], env={"COLUMNS": "200"}).output
    assert re.search(r"--out +PATH", sft) and re.search(r"--epochs +INT", sft), sft


# Mistakes that show only once the run is going: the same two lines and exit 2, and what was
# written before stays (metrics, episodes, a checkpoint), so --resume continues from there.
MID_RUN = {
    "every episode of K steps in a row is the environment's": (
        [
            "train",
            "good.yaml",
            "name=dead-env",
            "model.spec=tiny-random",
            "env.name=faulty:LosesItsDatabase",
            "env.kwargs={}",
            "trainer.steps=8",
            "trainer.group_size=2",
            "env.tasks_per_step=2",
            "env.eval_tasks=2",
            "rollout.max_turn_tokens=8",
            "trainer.stop_unlearnable_steps=2",
        ],
        "nothing can be learned: every episode of steps 0-1 was the environment's failure "
        "(8 of 8: reset failed: ConnectionError: database at db:5432 went away)",
        "then continue with --resume",
    ),
}


@pytest.mark.parametrize("case", list(MID_RUN))
def test_a_run_that_cannot_learn_stops_in_two_lines_and_resumes(case, world, tmp_path, monkeypatch):
    args, first, second = MID_RUN[case]
    r = _tracerl(args, world["site"], tmp_path)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr + r.stdout
    assert len(lines) == 2, r.stderr
    assert lines[0].startswith("error: ") and first in lines[0], lines
    assert second in lines[1], lines
    run = world["runs"] / "dead-env"
    steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps if m["phase"] == "train"] == [0, 1]  # then it stopped
    assert len(list((run / "episodes").glob("step_*"))) == 2  # both steps written
    before = _tree(run)
    # --resume continues from the checkpoint (in this process: the command was shown above)
    from tracerl.config.loading import load_config
    from tracerl.train.futility import UnlearnableRun
    from tracerl.train.loop import train

    monkeypatch.chdir(world["site"])
    monkeypatch.syspath_prepend(str(world["site"]))
    monkeypatch.setenv("TRACERL_CACHE", str(tmp_path))
    cfg = load_config(world["site"] / args[1], args[2:])
    with pytest.raises(UnlearnableRun, match="every episode of steps 2-3 was the environment"):
        train(cfg, resume=True, log=lambda line: None)
    after = _tree(run)
    written = [k for k in before if k.startswith("episodes/")]
    assert len(written) == 2 and all(after[k] == before[k] for k in written)  # kept as they were
    steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps if m["phase"] == "train"] == [0, 1, 2, 3]


SERVERS = {
    "serve": ["serve", "tiny-random"],
    "gateway": ["gateway", "tiny-random"],
    "serve-retriever": ["serve-retriever", "--corpus", "wiki"],  # its index: minutes to build
}


@pytest.mark.parametrize("command", list(SERVERS))
def test_a_server_on_a_port_in_use_says_so_in_two_lines_before_loading(command, tmp_path):
    """Every command that listens (`serve`, `gateway`, `serve-retriever`) on a port something
    listens on: two lines naming the port and the option, exit 2, and no model or corpus
    loaded first (nothing in the cache)."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cache = tmp_path / "cache"
        r = _tracerl([*SERVERS[command], "--port", str(port)], tmp_path, cache)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert len(lines) == 2 and "Traceback" not in r.stderr, r.stderr
    assert (
        lines[0]
        == f"error: port {port} on 127.0.0.1 is in use or not allowed (Address already in use)"
    )
    assert "--port" in lines[1]
    assert not cache.exists() or not any(cache.iterdir()), "a model was loaded first"


# A number out of an option's range, on every command that takes one: refused by the
# option's own bounds (typer's usage error naming the option and its range: exit 2, no
# traceback) before the command runs, so before anything loads or is written.
RANGES = {
    "serve on a port above 65535": (["serve", "tiny-random", "--port", "99999"], "--port"),
    "serve on a negative port": (["serve", "tiny-random", "--port", "-1"], "--port"),
    "serve at a negative temperature": (
        ["serve", "tiny-random", "--temperature", "-1"],
        "--temperature",
    ),
    "serve with no request per batch": (
        ["serve", "tiny-random", "--max-batch-size", "0"],
        "--max-batch-size",
    ),
    "gateway on a port above 65535": (["gateway", "tiny-random", "--port", "70000"], "--port"),
    "gateway at a negative temperature": (
        ["gateway", "tiny-random", "--temperature", "-0.5"],
        "--temperature",
    ),
    "gateway with no token a turn": (
        ["gateway", "tiny-random", "--max-turn-tokens", "0"],
        "--max-turn-tokens",
    ),
    "gateway with no request a session": (
        ["gateway", "tiny-random", "--max-requests", "0"],
        "--max-requests",
    ),
    "serve-retriever on a port above 65535": (["serve-retriever", "--port", "65536"], "--port"),
    "report of a negative number of episodes": (
        ["report", "RUNS/existing", "--n", "-5"],
        "--n",
    ),
    "report of no episode": (["report", "RUNS/existing", "--n", "0"], "--n"),
    "triage of no episode": (["triage", "RUNS/existing", "--n", "0"], "--n"),
    "eval of no task": (["eval", "good.yaml", "--n", "0", "--out", "RUNS/new-eval"], "--n"),
    "eval at a negative temperature": (
        ["eval", "--temperature", "-1", "--out", "RUNS/new-eval"],
        "--temperature",
    ),
    "readiness of no episode": (["readiness", "good.yaml", "--episodes", "0"], "--episodes"),
    "review queueing no answer": (
        ["review", "RUNS/existing", "--from-judge", "0"],
        "--from-judge",
    ),
    "show of a negative index": (["show", "good.yaml", "--index", "-1"], "--index"),
}


@pytest.mark.parametrize("case", list(RANGES))
def test_a_number_out_of_range_is_refused_before_the_command_runs(case, world, tmp_path):
    args, option = RANGES[case]
    args = [a.replace("RUNS", str(world["runs"])) for a in args]
    before = _tree(world["runs"])
    cache = tmp_path / "cache"
    cache.mkdir()
    r = _tracerl(args, world["site"], cache)
    said = " ".join(re.sub(r"[│╭╮╰╯─]", " ", r.stderr).split())
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr + r.stdout
    assert f"Invalid value for '{option}'" in said, r.stderr
    assert _tree(world["runs"]) == before
    assert not any(cache.iterdir()), "a model or tokenizer was loaded before the error"


def test_a_port_out_of_range_is_a_user_error_for_every_caller():
    """`port_free` is reached outside the command line too: a port the socket layer would
    take modulo 65536 (or refuse with an OverflowError) is a `UserError` naming the range."""
    from tracerl.cli.common import port_free
    from tracerl.errors import UserError

    for port in (65536, 99999, -1):
        with pytest.raises(UserError, match=f"--port {port}: a port is a number from 0 to 65535"):
            port_free("127.0.0.1", port)
    with pytest.raises(UserError) as e:
        port_free("127.0.0.1", 70000, "--judge-port")
    assert "--judge-port" in e.value.message and "--judge-port" in (e.value.hint or "")
