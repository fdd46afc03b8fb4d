"""The review pool in training runs: a reward that cannot decide (returns None) sends the
episode to ``RUN/review.sqlite`` with its evidence, never a reward of 0; `tracerl review RUN`
lists it and records a person's verdict, which counts in the evaluation's
``reviewed_success_rate``. A reward that never decides leaves every mean of rewards and
every success figure undefined (absent from the metrics, "undefined" on the terminal),
never 0.0. Tiny model, one step."""

from __future__ import annotations

import random
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

import tracerl
from tracerl.cli import app
from tracerl.report.run import iter_episodes, metric_rows
from tracerl.report.terminal import print_evals
from tracerl.rewards.judge.calibration import review_task
from tracerl.rewards.review import ReviewPool
from tracerl.train.review_queue import final_answer


@pytest.fixture(autouse=True)
def _own_registries(monkeypatch):
    """What a test registers stays its own."""
    from tracerl.envs import registry
    from tracerl.rewards import resolve as rewards

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(rewards, "_OBJECTS", dict(rewards._OBJECTS))


def _env() -> type:
    from tracerl.envs import ToolEnv
    from tracerl.envs.base import StepResult

    class SayDigit(ToolEnv):
        """A task is a digit to say (no ``question`` field: the pool shows its JSON)."""

        name = "say_digit"
        version = "1"
        splits = ("train", "heldout")

        async def setup(self, task: dict[str, Any], seed: int) -> list[dict[str, Any]]:
            return [{"role": "user", "content": f"Say {task['digit']}."}]

        async def finish(self, action: Any) -> StepResult:
            self.answer = {"text": action.answer or ""}
            return StepResult([], terminated=True, info={"answer": self.answer})

        def sample_tasks(self, n: int, *, seed: int = 0, split: str = "train") -> list[dict]:
            digits = range(6) if split == "train" else (7, 8, 9)
            pool = [{"id": f"{split}-{d}", "digit": d} for d in digits]
            return random.Random(f"{split}:{seed}").sample(pool, min(n, len(pool)))

    return SayDigit


def _settings(tmp_path, name: str) -> dict[str, Any]:
    return dict(
        name=name,
        out_dir=str(tmp_path),
        model="tiny-chars",
        trainer={"steps": 1, "group_size": 2, "eval_every": 0},
        rollout={"budgets": {"steps": 1}, "max_turn_tokens": 2},
        overrides={"env.tasks_per_step": 2, "env.eval_tasks": 3, "env.parser": "json_list"},
    )


def _cli(*args: str) -> str:
    out = CliRunner().invoke(app, list(args))
    assert out.exit_code == 0, out.output
    return out.output


@pytest.mark.timeout(300)
def test_a_training_run_queues_what_its_reward_cannot_decide_and_counts_verdicts(tmp_path):
    def only_eight(task: dict[str, Any]) -> float | None:
        """Decides one held-out task (8: wrong); every other one waits for a person."""
        return 0.0 if task["digit"] == 8 else None

    result = tracerl.train(env=_env(), reward=only_eight, log=None, **_settings(tmp_path, "mix"))
    run = result.run_dir
    pool = ReviewPool(run / "review.sqlite")  # written by the run itself
    samples = pool.samples()
    queued = {s.task_id for s in samples}
    assert {"heldout-7", "heldout-9"} <= queued and "heldout-8" not in queued
    assert any(t.startswith("train-") for t in queued)  # the training step's, too
    seven = [s for s in samples if s.task_id == "heldout-7"]
    assert seven[0].question == '{"digit": 7}'  # no question field: the task's JSON
    assert seven[0].evidence["undecided"] == ["only_eight"]  # the reward's own component

    # the final evaluation: success over the one decided episode; two wait for a person
    m = result.held_out
    assert m["success_rate"] == 0.0 and m["undecided_rate"] == pytest.approx(2 / 3)
    assert m["review_pending"] == 2.0 and m["reviewed_success_rate"] == 0.0
    (row,) = [r for r in metric_rows(run) if r.get("phase") == "train"]
    assert "train/reward_mean" not in row and row["train/undecided_rate"] == 1.0

    listed = _cli("review", str(run))
    assert '{"digit": 7}' in listed and '{"digit": 9}' in listed
    assert f"{len(samples)} pending" in listed
    assert "eval/heldout/reviewed_success_rate" in listed and "0.000" in listed
    for s in seven:  # a person says the answer to 7 is right
        said = _cli("review", str(run), "--decide", str(s.id), "--correct", "--reviewer", "me")
        assert "correct by me" in said
    # the verdict counts as the decided outcome: 7 right, 8 wrong; 9 still pending
    assert "eval/heldout/reviewed_success_rate" in said and "0.500" in said
    assert "eval/unknown" not in said

    # a person's verdict counts whatever the reward said (8: decided wrong), as for the
    # judged answers `tracerl review --from-judge` queues for people to check
    (eight,) = [
        e
        for e in iter_episodes(run)
        if e.phase == "eval" and e.stage == "train" and e.task["id"] == "heldout-8"
    ]
    pool.add(
        episode_id=eight.episode_id,
        task=review_task(eight.task),
        answer=final_answer(eight.trajectories),
        evidence={"source": "a test"},
    )
    (added,) = [s for s in pool.samples(pending_only=True) if s.task_id == "heldout-8"]
    said = _cli("review", str(run), "--decide", str(added.id), "--correct", "--reviewer", "me")
    assert "eval/heldout/reviewed_success_rate" in said and "1.000" in said


def test_review_of_a_run_whose_rewards_all_decided(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "phase": "train"}\n')
    assert "0 pending: no episode" in _cli("review", str(tmp_path))
    nothing = CliRunner().invoke(app, ["review", str(tmp_path / "nowhere")])
    assert nothing.exit_code == 2 and "no review.sqlite" in nothing.output


@pytest.mark.timeout(300)
def test_a_reward_that_never_decides_scores_nothing_rather_than_zero(tmp_path):
    def never(task: dict[str, Any]) -> float | None:
        return None

    result = tracerl.train(env=_env(), reward=never, log=None, **_settings(tmp_path, "never"))
    run = result.run_dir
    rows = metric_rows(run)
    for r in rows:  # neither a mean reward nor a success rate: nothing was decided
        assert not [k for k in r if k.endswith(("reward_mean", "success_rate"))], r
    evals = [r for r in rows if r.get("phase") == "eval"]
    assert len(evals) == 2 and all(r["eval/heldout/undecided_rate"] == 1.0 for r in evals)
    assert all(r["eval/heldout/review_pending"] == 3.0 for r in evals)
    assert result.success_rate is None

    console = Console(width=200, record=True)
    print_evals(run, console)
    text = console.export_text()
    assert "baseline undefined, after 1 GRPO steps undefined" in text
    assert "0.000" not in text
    listed = _cli("review", str(run))
    assert "undefined" in listed and "reviewed_success_rate" in listed
