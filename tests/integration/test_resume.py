"""`tracerl train` killed with SIGKILL mid-run, then resumed: no written episode is lost,
none is duplicated, and the data order is the uninterrupted run's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from tracerl.rollout.persist import read_run_trajectories

# groups of 8, not the config's 32: what is asserted is which episodes each step wrote
ARGS = ["trainer.steps=6", "trainer.checkpoint_every=2", "env.eval_tasks=2", "trainer.group_size=8"]


def _train(out: Path, *extra: str) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "tracerl.cli",
        "train",
        "configs/learn-arithmetic.yaml",
        f"out_dir={out}",
        *ARGS,
        *extra,
    ]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _ids(run: Path) -> list[str]:
    return [t.episode_id for _, t in read_run_trajectories(run)]


def _by_step(run: Path) -> dict[str, set[str]]:
    steps: dict[str, set[str]] = {}
    for path, t in read_run_trajectories(run):
        steps.setdefault(path.name, set()).add(t.episode_id)
    return steps


def test_resume_after_sigkill_loses_and_duplicates_nothing(tmp_path):
    reference = _train(tmp_path / "ref")  # the uninterrupted run, beside the crashing one
    ref_run = tmp_path / "ref" / "learn-arithmetic"

    crash = _train(tmp_path / "crash")
    run = tmp_path / "crash" / "learn-arithmetic"
    victim = run / "episodes" / "step_3.jsonl.gz"
    deadline = time.time() + 600
    while not (victim.exists() and victim.stat().st_size > 0) and time.time() < deadline:
        time.sleep(0.02)
    os.kill(crash.pid, signal.SIGKILL)
    crash.wait(timeout=30)
    before = _ids(run)
    assert before, "the run was killed before writing anything"
    out, _ = reference.communicate(timeout=900)
    assert reference.returncode == 0, out

    resumed = _train(tmp_path / "crash", "--resume")
    out, _ = resumed.communicate(timeout=900)
    assert resumed.returncode == 0, out
    assert "resumed from" in out

    after = _ids(run)
    assert not [i for i, n in Counter(after).items() if n > 1]  # nothing twice
    assert set(before) <= set(after)  # nothing written was lost
    assert _by_step(run) == _by_step(ref_run)  # the same tasks and members, step by step
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["phase"] == "train"] == list(range(6))


def test_sigterm_finishes_the_step_writes_a_checkpoint_and_exits_cleanly(tmp_path):
    proc = _train(tmp_path, "trainer.checkpoint_every=100")
    run = tmp_path / "learn-arithmetic"
    first = run / "episodes" / "step_1.jsonl.gz"
    deadline = time.time() + 600
    while not first.exists() and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out
    assert "stopped by a signal" in out
    checkpoints = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert checkpoints and all((run / "checkpoints" / c / "model.pt").exists() for c in checkpoints)


def test_resume_before_any_checkpoint_redoes_the_steps_without_duplicates(tmp_path):
    """...resumed as `tracerl train --resume RUN` names it, the run's folder moved first: it
    goes on where the folder is now."""
    crash = _train(tmp_path, "trainer.checkpoint_every=100")
    run = tmp_path / "learn-arithmetic"
    victim = run / "episodes" / "step_2.jsonl.gz"
    deadline = time.time() + 600
    while not (victim.exists() and victim.stat().st_size > 0) and time.time() < deadline:
        time.sleep(0.02)
    os.kill(crash.pid, signal.SIGKILL)
    crash.wait(timeout=30)
    assert not (run / "checkpoints").exists() or not any((run / "checkpoints").iterdir())
    before = _ids(run)
    run = run.rename(tmp_path / "moved")
    resume = [sys.executable, "-m", "tracerl.cli", "train", "--resume", str(run)]
    resumed = subprocess.Popen(resume, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = resumed.communicate(timeout=900)
    assert resumed.returncode == 0, out
    assert not (tmp_path / "learn-arithmetic").exists()  # where it was is not where it goes on
    after = _ids(run)
    assert not [i for i, n in Counter(after).items() if n > 1] and set(before) <= set(after)
    rows = [line for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = Counter(
        (r.split('"phase": ')[1][:7], r.split('"step": ')[1].split(",")[0]) for r in rows
    )
    assert all(n == 1 for n in steps.values()), steps
