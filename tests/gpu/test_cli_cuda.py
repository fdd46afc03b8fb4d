"""The commands a GPU user runs, end to end on CUDA, as they would type them.

`tracerl train configs/learn-arithmetic.yaml` with ``model.device`` left at auto must pick
the GPU, train in bf16-mixed to its end, checkpoint, resume, export (the export loads on a
machine without a GPU and evaluates there to the same held-out numbers), and the variants
that crashed before (async, LoRA, a run's checkpoint as a distillation teacher) must finish.
Small: the smoke config's tiny character model, a few steps each.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
SMALL = [
    "trainer.group_size=8",
    "env.eval_tasks=8",
    "trainer.checkpoint_every=2",
]


def tracerl(*args: str, cpu_only: bool = False, timeout: float = 300) -> str:
    """Run the CLI; its output (stdout and stderr) if it exits 0, else the test fails with
    its tail."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "120"}
    if cpu_only:
        env["CUDA_VISIBLE_DEVICES"] = ""  # a machine without a GPU
    done = subprocess.run(
        [sys.executable, "-m", "tracerl", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, (
        f"tracerl {' '.join(args)} exited {done.returncode}:\n{out[-4000:]}"
    )
    return out


def rows(run: Path, phase: str) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("phase") == phase]


def heldout(run: Path) -> tuple[float, float]:
    last = rows(run, "eval")[-1]
    return last["eval/heldout/success_rate"], last["eval/heldout/reward_mean"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, gpu) -> tuple[Path, str]:
    """A run trained with the device left at auto (the GPU when there is one)."""
    out = tmp_path_factory.mktemp("gpu-runs")
    log = tracerl(
        "train", "configs/learn-arithmetic.yaml", f"out_dir={out}", "trainer.steps=4", *SMALL
    )
    return out / "learn-arithmetic", log


def test_train_with_the_device_left_at_auto_runs_on_the_gpu_in_bf16_mixed(trained, gpu):
    run, log = trained
    want = "cuda:0 bf16-mixed (weights fp32, compute bf16)" if gpu == "cuda" else "cpu fp32"
    assert f"loading tiny-chars on {want}" in log, log[:2000]
    train = rows(run, "train")
    assert [r["step"] for r in train] == [0, 1, 2, 3] or len(train) == 4, train
    assert all(r["train/policy_tokens"] > 0 and r["train/grad_norm"] > 0 for r in train)
    # the sampler's and the learner's log-probs of the same tokens (docs/gpu.md's tolerance)
    assert max(r["train/logprob_gap_mean"] for r in train) < 0.05
    assert (run / "report" / "index.html").is_file()


def test_a_gpu_run_resumes_to_more_steps(trained, tmp_path):
    run, _ = trained
    out = run.parent
    tracerl(
        "train",
        "configs/learn-arithmetic.yaml",
        f"out_dir={out}",
        "trainer.steps=6",
        *SMALL,
        "--resume",
    )
    assert len(rows(run, "train")) == 6


def test_an_export_of_a_gpu_run_evaluates_on_a_cpu_as_on_the_gpu(trained, tmp_path, gpu):
    """Exported with the GPU visible; evaluated by a process that sees none (fp32 on the
    CPU) and on the GPU in fp32: the same held-out success and mean reward."""
    run, _ = trained
    export = tmp_path / "export"
    tracerl("export", str(run), "--out", str(export))
    assert (export / "model.safetensors").is_file()
    common = ["configs/learn-arithmetic.yaml", f"model.spec=hf:{export}", "env.eval_tasks=8"]
    tracerl("eval", *common, "model.device=cpu", "--out", str(tmp_path / "cpu"), cpu_only=True)
    tracerl(
        "eval",
        *common,
        f"model.device={gpu}",
        "trainer.precision=fp32",
        "--out",
        str(tmp_path / "gpu"),
    )
    assert heldout(tmp_path / "cpu") == heldout(tmp_path / "gpu")


@pytest.mark.parametrize(
    "variant",
    [
        ["trainer.mode=async", "trainer.steps=3"],
        ["model.lora.r=4", "trainer.steps=2"],
        ["trainer.precision=bf16", "trainer.steps=2"],
        ["trainer.precision=fp32", "trainer.steps=2"],
        ["trainer.kl_coef=0.05", "trainer.steps=2"],
        ["model.kv_cache=static", "model.compile=true", "trainer.steps=2"],
        ["trainer.micro_batch_tokens=auto", "trainer.steps=2"],
    ],
    ids=["async", "lora", "pure-bf16", "fp32", "kl-reference", "static-compiled", "auto-micro"],
)
def test_the_variants_that_crashed_on_a_gpu_run_to_their_end(variant, tmp_path):
    tracerl("train", "configs/learn-arithmetic.yaml", f"out_dir={tmp_path}", *SMALL, *variant)
    assert len(rows(tmp_path / "learn-arithmetic", "train")) == int(variant[-1].split("=")[1])


def test_a_gpu_runs_checkpoint_teaches_a_student_on_the_gpu(trained, tmp_path):
    run, _ = trained
    tracerl(
        "train",
        "configs/learn-arithmetic.yaml",
        f"out_dir={tmp_path}",
        *SMALL,
        "trainer.steps=2",
        f"trainer.distill.teacher=run:{run}",
    )
    train = rows(tmp_path / "learn-arithmetic", "train")
    assert len(train) == 2
    last = train[-1]
    assert last["train/distill/teacher_tokens"] > 0 and last["train/distill/teacher_failures"] == 0
