"""`torchrun --nproc-per-node 2 -m tracerl train` on CPU (gloo): a ``ddp`` run, one of
whose ranks is killed with SIGKILL, resumes to the end and matches a single-process run's
metrics step by step; a single process's checkpoint resumes under ``fsdp2``, and
``fsdp2``'s in one process again. (Two processes with ``strategy: single`` are refused: a unit test,
`tests/unit/test_distributed_learner.py`.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# groups of 8 (the config's 32 cost 4 times the sampling): every step still has rewarded
# members, so its gradient norm is far from 0 and tells the runs apart
ARGS = ["trainer.steps=6", "trainer.checkpoint_every=2", "env.eval_tasks=2", "trainer.group_size=8"]
RUN = "learn-arithmetic"
# what one step's metrics must agree on, and how closely (float32 sums in another order)
SAME = {
    "train/reward_mean": 0.0,
    "train/policy_tokens": 0.0,
    "train/loss": 1e-5,
    "train/grad_norm": 1e-4,
}


def _cmd(out: Path, nproc: int, *extra: str) -> list[str]:
    head = [sys.executable, "-m"]
    if nproc > 1:
        head += ["torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "-m"]
    return [*head, "tracerl", "train", "configs/learn-arithmetic.yaml", f"out_dir={out}"]


def _train(out: Path, nproc: int, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [*_cmd(out, nproc), *ARGS, *extra],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _finish(proc: subprocess.Popen, timeout: float = 900) -> str:
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-4000:]
    return out


def _train_rows(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["phase"] == "train"]


def _assert_same_steps(run: Path, reference: Path) -> None:
    got, want = _train_rows(run), _train_rows(reference)
    assert [r["step"] for r in got] == [r["step"] for r in want] == list(range(6))
    assert all(w["train/grad_norm"] > 0.1 for w in want)  # real updates to compare
    for g, w in zip(got, want, strict=True):
        for key, rel in SAME.items():
            assert g[key] == pytest.approx(w[key], rel=rel, abs=1e-7), (g["step"], key)


def _rank_pid(marker: Path, rank: int) -> int | None:
    """The pid of the torchrun worker of `rank` whose command line names `marker`."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        ours = f"out_dir={marker}".encode() in cmdline and b"torch.distributed.run" not in cmdline
        if ours and f"RANK={rank}".encode() in environ:
            return int(entry.name)
    return None


@pytest.fixture(scope="module")
def single(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("single")
    _finish(_train(out, 1))
    return out / RUN


def test_a_ddp_run_survives_a_killed_rank_and_matches_one_process(tmp_path, single):
    out = tmp_path / "ddp"
    proc = _train(out, 2, "trainer.learner.strategy=ddp")
    run = out / RUN
    victim = run / "checkpoints" / "step_3"  # two checkpoints written, then kill rank 1
    deadline = time.time() + 240
    while not victim.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    pid = _rank_pid(out, 1)
    assert pid is not None, "rank 1 not found"
    os.kill(pid, signal.SIGKILL)
    text, _ = proc.communicate(timeout=600)
    assert proc.returncode != 0, "the run went on without a rank"
    assert "learner rank" in text and "--resume" in text, text[-3000:]  # said, not a hang
    train_lines = [r["step"] for r in _train_rows(run)]
    assert train_lines[:4] == [0, 1, 2, 3] and len(train_lines) < 6, text[-3000:]

    resumed = _train(out, 2, "trainer.learner.strategy=ddp", "--resume")
    text = _finish(resumed)
    assert "resumed from" in text
    _assert_same_steps(run, single)


def test_checkpoints_move_between_one_process_and_fsdp2(tmp_path, single):
    # one process for steps 0-1, fsdp2 for 2-3 (from its checkpoint), one process again
    # for 4-5 (from fsdp2's): both directions in one chain of three launches
    out = tmp_path / "one-fsdp2-one"
    _finish(_train(out, 1, "trainer.steps=2"))
    _finish(_train(out, 2, "trainer.learner.strategy=fsdp2", "trainer.steps=4", "--resume"))
    _finish(_train(out, 1, "--resume"))
    _assert_same_steps(out / RUN, single)
