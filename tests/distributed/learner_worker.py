"""One learner update on a fixed batch, in one process or as one rank of several.

The ranks other than 0 start from other weights (as after a warm start that only rank 0
ran): the learner must start every rank, and its KL reference, from rank 0's.

``python -m tests.distributed.learner_worker OUT`` under ``torchrun`` (or with RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT set) runs every case of `CASES` with the strategy each
names and writes rank 0's results to ``OUT/<case>.pt``: the update's metrics and the updated
weights (and, from each rank, whether its replica or shard agrees). `run_case(case)` in a
plain process is the single-process reference the test compares them with.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

import torch

from tracerl.types import Segment, Trajectory

# (strategy, aggregation, micro-batch tokens): 100 tokens cut the step into
# 5 micro-batches of unequal sizes, so two ranks run 2 and 3 of them
CASES = {
    "ddp-token-mean": ("ddp", "token-mean", 100),
    "ddp-seq-mean": ("ddp", "seq-mean-token-mean", 100),
    "fsdp2-token-mean": ("fsdp2", "token-mean", 100),
    "fsdp2-seq-mean": ("fsdp2", "seq-mean-token-sum", 100),
    "fsdp2-one-batch": ("fsdp2", "token-mean", 100_000),  # rank 1 has nothing to run
    "ddp-one-batch": ("ddp", "seq-mean-token-sum-norm", 100_000),  # rank 1 runs nothing
    "ddp-kl": ("ddp", "token-mean", 100),  # a KL term against a frozen copy
    "fsdp2-lora-kl": ("fsdp2", "seq-mean-token-mean", 100),  # adapters only; KL: adapters off
}


def trajectories(seed: int = 0) -> tuple[list[Trajectory], list[float]]:
    """Groups sharing a prompt, turns of unequal lengths, tool output between them."""
    rng = random.Random(seed)
    out, advantages = [], []
    for g in range(3):
        prompt = [rng.randrange(1, 5000) for _ in range(18 + 4 * g)]
        for _ in range(3):
            segs = [Segment("prompt", prompt)]
            for turn in range(rng.randint(1, 2)):
                n = rng.randint(3, 14)
                segs.append(
                    Segment(
                        "policy",
                        [rng.randrange(1, 5000) for _ in range(n)],
                        logprobs=[-rng.uniform(0.5, 8.0) for _ in range(n)],
                        step=turn,
                    )
                )
                segs.append(Segment("environment", [rng.randrange(1, 5000) for _ in range(5)]))
            out.append(Trajectory(tuple(segs)))
            advantages.append(rng.uniform(-1.5, 1.5))
    return out, advantages


def initial_model(case: str) -> Any:
    """The tiny random model (with LoRA adapters in the LoRA cases), the same on every rank."""
    from tracerl.models import load

    model = load("tiny-random").model
    if "lora" in case:
        from tracerl.train.lora import apply_lora

        model = apply_lora(model, r=4, alpha=8, seed=0)
        with torch.no_grad():  # B starts at 0: give the adapters something to differ by
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.02, generator=torch.Generator().manual_seed(len(n)))
    return model


def run_case(case: str, ranks: Any = None) -> dict[str, Any]:
    from tracerl.algos.losses import ClipConfig
    from tracerl.train.distributed import make_strategy
    from tracerl.train.learner import Learner, LearnerConfig

    name, agg, micro = CASES[case]
    model = initial_model(case)
    if ranks is not None and not ranks.main:  # as after a warm start only rank 0 ran
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01)
    cfg = LearnerConfig(
        lr=1e-3,
        micro_batch_tokens=micro,
        clip=ClipConfig(agg=agg),
        kl_coef=0.1 if "kl" in case else 0.0,
        share_prefix=name != "fsdp2",  # fsdp2 runs each prompt per row: the reference too
    )
    learner = Learner(model, cfg, make_strategy(name if ranks else "single", ranks))
    trajs, advantages = trajectories()
    metrics = learner.apply_update(trajs, advantages)
    grads = {}
    for n, p in learner.trained.named_parameters():  # the step's (clipped) gradient
        if not p.requires_grad:
            continue
        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        grads[n] = g.clone()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    return {"metrics": metrics, "weights": weights, "grads": grads}


def main(out: Path) -> None:
    import torch.distributed as dist

    from tracerl.train.distributed.ranks import close_process_group, init_process_group, launched

    ranks = launched()
    init_process_group(ranks, torch.device("cpu"), timeout_s=120)
    try:
        for case in CASES:
            result = run_case(case, ranks)
            if CASES[case][0] == "ddp":  # every replica ends equal to rank 0's
                mine = torch.cat([v.flatten() for v in result["weights"].values()])
                first = mine.clone()
                dist.broadcast(first, src=0)
                result["replicas_equal"] = bool(torch.equal(mine, first))
                agree = torch.tensor([int(result["replicas_equal"])])
                dist.all_reduce(agree, op=dist.ReduceOp.MIN)
                result["replicas_equal"] = bool(agree.item())
            if ranks.main:
                torch.save(result, out / f"{case}.pt")
    finally:
        close_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
