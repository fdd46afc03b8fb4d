"""What the training tests of environment adapters (reasoning-gym, OpenEnv, verifiers) share:
a tiny two-step run of an example config, and what every such run must show."""

from __future__ import annotations

import json
from typing import Any

from tracerl.rollout.persist import read_run_trajectories
from tracerl.train.loop import train

TINY = [
    "model.spec=tiny-random",
    "trainer.steps=2",
    "trainer.group_size=2",
    "env.tasks_per_step=2",
    "env.eval_tasks=2",
    "env.kwargs.train_size=50",
    "env.kwargs.heldout_size=20",
    "rollout.max_turn_tokens=8",
    "model.max_batch_size=8",
]
"""Overrides that make an example config a tiny model's two-step run."""


def trains_two_steps(cfg: Any, component: str) -> list[Any]:
    """Train `cfg`; check it logged two training steps, the reward `component` and a held-out
    evaluation; return its training episodes' trajectories."""
    train(cfg, log=lambda _: None)
    run = cfg.run_dir
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r.get("phase") == "train"] == [0, 1]
    assert any(f"train/reward/{component}" in r for r in rows)
    assert any("eval/heldout/success_rate" in r for r in rows)
    trajs = [t for _, t in read_run_trajectories(run)]
    assert trajs
    return trajs
