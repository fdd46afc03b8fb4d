"""Checkpoints: ``checkpoints/step_<n>/`` with the model, the optimizer, every RNG and the
loop's state (step, policy version). Written under a temporary name and renamed into place,
so a checkpoint folder that exists is complete; the newest `trainer.keep_last` (two) are
kept.

One format for every learner strategy: the model's full state dict (LoRA: the adapters),
and the optimizer's state keyed by parameter name (`tracerl.train.distributed.
optimizer_state`), gathered on rank 0 from a sharded learner. A single-process run resumes
a ``ddp`` or ``fsdp2`` run's checkpoint, and the reverse; checkpoints from before (the
optimizer's integer-keyed state) still load."""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tracerl.cache import save_folder_atomically
from tracerl.models.refs import checkpoint_steps
from tracerl.train.lora import is_lora, trainable_state

KEEP = 2


@dataclass
class Checkpoint:
    step: int  # the last step whose update it contains (-1: the warm start, no RL step)
    policy_version: int
    path: Path


def save_checkpoint(
    run_dir: Path,
    step: int,
    model: Any,
    learner: Any,
    sampler: Any,
    extra: dict[str, Any],
    *,
    keep: int = KEEP,
    log: Callable[[str], None] | None = None,
) -> Path:
    """`learner`: None before RL's optimizer exists (after a warm start). The newest `keep`
    checkpoints stay (``trainer.keep_last``). `log` is told when the write starts and what
    it wrote (a full fine-tune's checkpoint is the fp32 weights and AdamW's two moments,
    three times the weights: 1.6 GB and tens of seconds for SmolLM2-135M)."""
    target = run_dir / "checkpoints" / f"step_{step}"
    t0 = time.perf_counter()
    if log is not None:
        log(f"writing checkpoint {target.name} (weights, optimizer state, RNGs) ...")
    # every learner rank takes part in gathering the optimizer's state, before any write
    optimizer_state = learner.optimizer_state() if learner is not None else None

    def write(folder: Path) -> None:
        folder.mkdir(parents=True)
        torch.save(trainable_state(model), folder / "model.pt")  # LoRA: the adapters only
        if optimizer_state is not None:
            torch.save(optimizer_state, folder / "optimizer.pt")
        torch.save(
            {
                "torch": torch.get_rng_state(),
                "python": random.getstate(),
                # a remote engine's turns are seeded per request: no generator of its own
                "sampler": sampler.generator.get_state() if hasattr(sampler, "generator") else None,
            },
            folder / "rng.pt",
        )
        state = {"step": step, "policy_version": sampler.policy_version, **extra}
        (folder / "state.json").write_text(json.dumps(state))
        for f in folder.iterdir():  # durable before it is renamed into place
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())

    save_folder_atomically(target, write)
    for old in sorted(_steps(run_dir))[:-keep]:
        shutil.rmtree(run_dir / "checkpoints" / f"step_{old}", ignore_errors=True)
    if log is not None:
        log(describe_written(target, time.perf_counter() - t0))
    return target


def describe_written(folder: Path, seconds: float) -> str:
    """``wrote checkpoint step_3: 1.62 GB (model.pt 0.54 GB, optimizer.pt 1.08 GB) in 41 s``."""
    sizes = {f.name: f.stat().st_size for f in sorted(folder.iterdir())}
    parts = ", ".join(
        f"{name} {_gb(n)}" for name, n in sizes.items() if name in ("model.pt", "optimizer.pt")
    )
    return (
        f"wrote checkpoint {folder.name}: {_gb(sum(sizes.values()))} ({parts}) in {seconds:.1f} s"
    )


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def _steps(run_dir: Path) -> list[int]:
    return checkpoint_steps(run_dir)


def latest_checkpoint(run_dir: Path) -> Checkpoint | None:
    steps = _steps(run_dir)
    if not steps:
        return None
    path = run_dir / "checkpoints" / f"step_{steps[-1]}"
    state = json.loads((path / "state.json").read_text())
    return Checkpoint(state["step"], state["policy_version"], path)


def restore(ckpt: Checkpoint, model: Any, learner: Any, sampler: Any) -> None:
    """Load `ckpt` into `model` (rank 0's) and `learner` (every rank's), the RNGs and the
    sampler's policy version."""
    state = torch.load(ckpt.path / "model.pt", weights_only=True, map_location="cpu")
    if is_lora(model):  # adapters only: every one of them must be there
        missing = set(trainable_state(model)) - set(state)
        if missing:
            raise ValueError(f"{ckpt.path}: checkpoint lacks adapter weights {sorted(missing)[:3]}")
        model.load_state_dict(state, strict=False)
    else:
        model.load_state_dict(state)
    optimizer_state = None
    if (ckpt.path / "optimizer.pt").exists():
        # on the CPU: the optimizer moves it to its parameters (each rank's own device)
        optimizer_state = torch.load(
            ckpt.path / "optimizer.pt", weights_only=True, map_location="cpu"
        )
    learner.load_state(optimizer_state)
    rng = torch.load(ckpt.path / "rng.pt", weights_only=False)
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    if rng.get("sampler") is not None and hasattr(sampler, "generator"):
        sampler.generator.set_state(rng["sampler"])
    sampler.policy_version = ckpt.policy_version
