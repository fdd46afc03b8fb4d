"""Every episode of a run has its own id: the warm start's reference episodes, the baseline
and warm-start evaluations (both at step 0, with the same seed), the training steps and the
evaluations after them. A shared server keyed by ``${episode_id}`` (docs/mcp.md) then gives
every episode its own state; before, the warm start's ids were step 0's and the two step-0
evaluations shared theirs."""

from __future__ import annotations

import collections
import subprocess
import sys
from pathlib import Path

from tracerl.report.run import iter_episodes

ROOT = Path(__file__).resolve().parents[2]


def test_every_episode_of_a_run_with_a_warm_start_and_evaluations_has_its_own_id(tmp_path):
    cmd = [sys.executable, "-m", "tracerl", "train", "configs/learn-arithmetic.yaml"]
    cmd += [
        f"out_dir={tmp_path}",
        "trainer.steps=2",
        "trainer.group_size=2",
        "env.tasks_per_step=2",
        "env.eval_tasks=3",
        "trainer.eval_every=1",
        "warm_start={tasks: 2}",
    ]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    records = list(iter_episodes(tmp_path / "learn-arithmetic"))
    where = {(r.phase, r.stage) for r in records}
    assert {("warm_start", "warm_start"), ("train", "train")} <= where, where
    assert {("eval", "baseline"), ("eval", "warm_start"), ("eval", "train")} <= where, where
    ids = collections.Counter(r.trajectories[0].episode_id for r in records)
    repeated = {i: n for i, n in ids.items() if n > 1}
    assert not repeated, repeated
    # the same task drawn by several phases: told apart by the stage in its id
    stages = {i.split(":")[-3] for i in ids if i.split(":")[-3][0] in "ew"}
    assert {"warm", "eval-baseline", "eval-warm_start", "eval-train"} <= stages, stages
