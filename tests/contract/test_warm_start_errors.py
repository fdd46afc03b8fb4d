"""A warm start whose reference agent succeeds on no task, through the real `tracerl train`:
two lines naming whose failure it was (here the environment's: its database went away) and
the fault, exit 2, no traceback; the run directory keeps what was written, and --resume,
once the environment is fixed, plays the reference again and trains."""

from __future__ import annotations

import json

import yaml

from tests.command import run_tracerl
from tests.env_sources import LOSES_ITS_DATABASE

ENV = "from tracerl.envs.arithmetic import Arithmetic\n\n" + LOSES_ITS_DATABASE

CONFIG = {
    "name": "warm",
    "model": {"spec": "tiny-chars"},
    "env": {
        "name": "dbenv:LosesItsDatabase",
        "parser": "json_list",
        "tasks_per_step": 2,
        "eval_tasks": 2,
    },
    "trainer": {"steps": 1, "group_size": 2, "reward": "arithmetic"},
    "rollout": {"max_turn_tokens": 4, "budgets": {"steps": 1}, "reserve": None},
    "warm_start": {"tasks": 3},
}


def test_a_warm_start_the_environment_failed_is_two_lines_and_resumes(tmp_path, monkeypatch):
    (tmp_path / "dbenv.py").write_text(ENV)
    config = tmp_path / "warm.yaml"
    config.write_text(yaml.safe_dump({**CONFIG, "out_dir": str(tmp_path / "runs")}))
    r = run_tracerl(["train", str(config)], tmp_path, tmp_path / "cache")
    lines = [x for x in r.stderr.splitlines() if x.strip()]  # progress goes to stdout
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr + r.stdout, r.stderr
    assert len(lines) == 2, r.stderr
    assert lines[0] == (
        "error: warm start: the reference agent succeeded on none of 3 tasks (3 of 3 were the "
        "environment's failure: reset failed: ConnectionError: database at db:5432 went away)"
    ), r.stderr
    run = tmp_path / "runs" / "warm"
    assert lines[1].startswith("  the environment (or a tool server it uses) failed")
    assert f"tracerl triage {run}" in lines[1] and "--resume" in lines[1]
    assert "check_script" not in lines[1]  # the script did nothing wrong

    # nothing lost: the config, the baseline, the reference's episodes (set aside: a resume
    # does not reuse the failed ones)
    assert (run / "config.yaml").is_file()
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["stage"] for r in rows if r["phase"] == "eval"] == ["baseline"]
    assert (run / "warm_start" / "failed_1" / "episodes" / "step_0.jsonl.gz").is_file()
    assert not (run / "warm_start" / "episodes" / "step_0.jsonl.gz").exists()
    from tracerl.report.run import iter_episodes

    warm = [e for e in iter_episodes(run) if e.phase == "warm_start"]
    assert len(warm) == 3  # triage and the report still read them

    # the database is back: --resume plays the reference again and trains
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("TRACERL_CACHE", str(tmp_path / "cache"))
    import dbenv

    from tracerl.config.loading import load_config
    from tracerl.envs.arithmetic import Arithmetic
    from tracerl.train.loop import train

    monkeypatch.setattr(dbenv.LosesItsDatabase, "reset", Arithmetic.reset)
    train(load_config(config, []), resume=True, log=lambda line: None)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    (ws,) = [r for r in rows if r["phase"] == "warm_start"]
    assert ws["warm_start/kept"] == ws["warm_start/episodes"] == 3
    assert [r["step"] for r in rows if r["phase"] == "train"] == [0]
    assert (run / "warm_start" / "episodes" / "step_0.jsonl.gz").is_file()
    assert (run / "warm_start" / "failed_1" / "episodes" / "step_0.jsonl.gz").is_file()
