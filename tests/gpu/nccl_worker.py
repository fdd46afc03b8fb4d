"""One learner update with the ``ddp`` and ``fsdp2`` strategies as rank 0 of 1 on the GPU
(NCCL), in fp32 and bf16-mixed, beside the single-process learner's on the same batch.

``torchrun --nproc-per-node 1 -m tests.gpu.nccl_worker OUT DEVICE`` writes ``OUT/results.pt``:
per (strategy, precision), the update's metrics. (A world of one is still a process group:
every collective, the sharding and FSDP2's mixed-precision policy run for real.)
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch

from tests.distributed.learner_worker import trajectories


def main(out: Path, device: str) -> None:
    import torch.distributed as dist

    from tracerl.models import load
    from tracerl.models.placement import place, resolve
    from tracerl.train.distributed.ranks import launched
    from tracerl.train.distributed.strategy import (
        DataParallel,
        FullyShardedDataParallel,
        Strategy,
    )
    from tracerl.train.learner import Learner, LearnerConfig

    ranks = launched()
    # (init_process_group skips a world of one: joined here by hand)
    if device == "cuda":
        torch.cuda.set_device(0)
    dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=0, world_size=1)
    base = load("tiny-random").model
    trajs, advantages = trajectories()
    results = {}
    try:
        for precision in ("fp32", "bf16-mixed"):
            for name, make in (
                ("single", Strategy),
                ("ddp", DataParallel),
                ("fsdp2", FullyShardedDataParallel),
            ):
                model = place(copy.deepcopy(base), resolve(device, "auto", precision))
                cfg = LearnerConfig(lr=1e-3, micro_batch_tokens=100, share_prefix=False)
                learner = Learner(model, cfg, make(ranks))
                metrics = learner.apply_update(trajs, advantages)
                weights = next(iter(model.parameters()))
                metrics["weights_dtype"] = str(weights.dtype)
                metrics["weights_device"] = str(weights.device)
                results[(name, precision)] = metrics
    finally:
        dist.destroy_process_group()
    torch.save(results, out / "results.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
