"""A whole `tracerl train` in bf16-mixed (the GPU default) on the CPU: sampling, the update,
evaluation, a checkpoint and a resume all run under autocast over fp32 master weights, and
what is saved is fp32. The same plumbing the GPU tier runs on CUDA (tests/gpu/)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
ARGS = ["trainer.group_size=8", "env.eval_tasks=4", "trainer.checkpoint_every=2"]


def _train(out: Path, *extra: str) -> str:
    cmd = [sys.executable, "-m", "tracerl", "train", "configs/learn-arithmetic.yaml"]
    cmd += [f"out_dir={out}", "trainer.precision=bf16-mixed", *ARGS, *extra]
    done = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return done.stdout + done.stderr


def test_a_bf16_mixed_run_trains_checkpoints_in_fp32_and_resumes(tmp_path):
    log = _train(tmp_path, "trainer.steps=2")
    assert "on cpu bf16-mixed (weights fp32, compute bf16)" in log, log[:1500]
    # a checkpoint write says it is under way and what it wrote (SmolLM2's take a while)
    assert "writing checkpoint step_1 (weights, optimizer state, RNGs) ..." in log, log
    assert re.search(
        r"wrote checkpoint step_1: [\d.]+ MB \(model\.pt [\d.]+ MB, optimizer\.pt", log
    )
    run = tmp_path / "learn-arithmetic"
    ckpt = run / "checkpoints" / "step_1"
    weights = torch.load(ckpt / "model.pt", weights_only=True)
    assert {v.dtype for v in weights.values()} == {torch.float32}
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["phase"] == "train"]
    assert len(train) == 2 and all(r["train/grad_norm"] > 0 for r in train)
    # sampler (token by token on its KV cache) and learner (a full forward), both in bf16
    assert max(r["train/logprob_gap_mean"] for r in train) < 0.05
    _train(tmp_path, "trainer.steps=4", "--resume")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["phase"] == "train"] == [0, 1, 2, 3]
