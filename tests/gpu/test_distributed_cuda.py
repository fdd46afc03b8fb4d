"""The distributed learner on NCCL: ``ddp`` and ``fsdp2`` as one rank on the GPU take the
single-process learner's update (fp32 exactly as the CPU tests hold it; bf16-mixed through
FSDP2's `MixedPrecisionPolicy` within bf16's rounding), and keep fp32 master weights."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def results(tmp_path_factory, gpu):
    out = tmp_path_factory.mktemp("nccl")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1"]
    cmd += ["-m", "tests.gpu.nccl_worker", str(out), gpu]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return torch.load(out / "results.pt", weights_only=False)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
@pytest.mark.parametrize(("precision", "rel"), [("fp32", 1e-4), ("bf16-mixed", 2e-2)])
def test_a_strategy_on_one_gpu_rank_takes_the_single_process_update(
    results, strategy, precision, rel, gpu
):
    mine, single = results[(strategy, precision)], results[("single", precision)]
    assert mine["train/policy_tokens"] == single["train/policy_tokens"] > 0
    for key in ("train/loss", "train/grad_norm"):
        assert mine[key] == pytest.approx(single[key], rel=rel, abs=1e-6), key
    assert mine["weights_dtype"] == "torch.float32"  # fp32 master weights either way
    assert mine["weights_device"].startswith(gpu)
