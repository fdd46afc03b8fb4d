"""Training from Python (`tracerl.train`, `tracerl.Run`): the README's example as it is
written, and a run of an environment class and a reward function that no import path can
find (defined inside the test), trained, resumed from Python, and refused with a clear error
when resumed from the command line, which cannot see them."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import tracerl
from tracerl.report.run import metric_rows

README = Path(__file__).parents[2] / "README.md"
MARKER = "<!-- readme-python-api:"


@pytest.fixture(autouse=True)
def _own_registries(monkeypatch):
    """What a test registers stays its own."""
    from tracerl.envs import registry
    from tracerl.rewards import resolve as rewards

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(rewards, "_OBJECTS", dict(rewards._OBJECTS))


def readme_block() -> str:
    """The ```python block under the README's marker: what this test runs, so the two
    cannot drift."""
    after = README.read_text().split(MARKER, 1)[1]
    return after.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.timeout(300)
def test_the_readme_example_trains(tmp_path, monkeypatch, capsys):
    code = readme_block()
    assert "tracerl.train(" in code
    monkeypatch.chdir(tmp_path)
    scope: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(code, str(README), "exec"), scope)
    result = scope["result"]
    assert result.run_dir == Path("runs/from-python")
    assert (tmp_path / result.run_dir / "metrics.jsonl").is_file()
    assert (tmp_path / result.run_dir / "config.yaml").is_file()
    assert isinstance(result.success_rate, float) and 0.0 <= result.success_rate <= 1.0
    assert result.held_out["episodes"] == 8.0  # env.eval_tasks, on the held-out split
    train_rows = [r for r in result.history if r["phase"] == "train"]
    assert [r["step"] for r in train_rows] == list(range(10))
    out = capsys.readouterr().out
    assert "eval (baseline, step 0)" in out  # progress lines, as the command prints them
    assert f"runs/from-python {result.success_rate}" in out


@pytest.mark.timeout(300)
def test_an_environment_class_and_a_reward_function_of_this_test(tmp_path):
    """Neither object can be imported back by name: both are registered for this process as
    ``python:`` names, config.yaml says so, the function scores every episode, the run
    resumes from Python, and the command line refuses to resume it with what to do."""
    from tracerl.envs import ToolEnv
    from tracerl.envs.base import StepResult

    class SayDigit(ToolEnv):
        name = "say_digit"
        version = "1"
        splits = ("train", "heldout")

        async def setup(self, task: dict[str, Any], seed: int) -> list[dict[str, Any]]:
            return [{"role": "user", "content": f"Say {task['digit']}."}]

        async def finish(self, action: Any) -> StepResult:
            self.answer = {"text": action.answer or ""}
            return StepResult([], terminated=True, info={"answer": self.answer})

        def sample_tasks(self, n: int, *, seed: int = 0, split: str = "train") -> list[dict]:
            digits = range(7) if split == "train" else range(7, 10)
            pool = [{"id": f"{split}-{d}", "digit": d} for d in digits]
            return random.Random(f"{split}:{seed}").sample(pool, min(n, len(pool)))

    scored: list[str] = []

    def quarter(task: dict[str, Any], stop_reason: str) -> float:
        scored.append(task["id"])
        return 0.25

    settings = dict(
        name="own",
        out_dir=str(tmp_path),
        model="tiny-chars",
        trainer={"steps": 1, "group_size": 2, "eval_every": 0},
        rollout={"budgets": {"steps": 1}, "max_turn_tokens": 2},
        overrides={"env.tasks_per_step": 2, "env.eval_tasks": 2, "env.parser": "json_list"},
    )
    lines: list[str] = []
    result = tracerl.train(env=SayDigit, reward=quarter, log=lines.append, **settings)
    run = tmp_path / "own"
    assert result.run_dir == run and lines  # progress went to `log`, not stdout
    # the rehearsal's empty answer, 2 evaluated before training, 2 tasks x 2 episodes
    # trained, 2 evaluated after: each scored by `quarter`
    assert len(scored) == 1 + 2 + 2 * 2 + 2
    (train_row,) = [r for r in result.history if r["phase"] == "train"]
    assert train_row["train/reward/quarter"] == 0.25  # the component is the function
    assert result.held_out["reward/quarter"] == 0.25 and result.success_rate == 0.0
    text = (run / "config.yaml").read_text()
    written = yaml.safe_load(text)
    assert written["env"]["name"] == f"python:{SayDigit.__qualname__}"
    assert written["trainer"]["reward"] == f"python:{quarter.__qualname__}"
    assert text.startswith("# env.name: python:") and "resume=True" in text

    # resumed from Python with the same objects: the next step, nothing redone
    more = {**settings, "trainer": {**settings["trainer"], "steps": 2}}
    resumed = tracerl.train(env=SayDigit, reward=quarter, resume=True, log=None, **more)
    steps = [r["step"] for r in metric_rows(run) if r["phase"] == "train"]
    assert steps == [0, 1] and resumed.success_rate == 0.0
    # a new run under the same name: refused, saying how to continue it from Python
    with pytest.raises(tracerl.train.resume.RunExistsError, match="already holds a run") as e:
        tracerl.train(env=SayDigit, reward=quarter, log=None, **settings)
    assert "resume=True" in e.value.hint and e.value.hint in e.value.__notes__

    # the command line has neither object: two lines saying what they were, before any load
    cli = subprocess.run(
        [sys.executable, "-m", "tracerl", "train", str(run / "config.yaml"), "--resume"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cli.returncode == 2, cli.stdout + cli.stderr
    assert "Traceback" not in cli.stderr
    assert "was a Python object given to tracerl.train()" in cli.stderr
    assert "env=YourEnv, resume=True" in cli.stderr
