"""This process's place in a ``torchrun`` launch, and the process group.

``torchrun --nproc-per-node N -m tracerl train CONFIG`` sets ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK`` and the rendezvous address for each process; `launched` reads them (a plain
``tracerl train`` is rank 0 of 1). `init_process_group` picks the backend from the device:
NCCL for GPUs (each rank on ``cuda:LOCAL_RANK``), gloo on CPU. Its timeout bounds every
collective: a rank that hangs (or, with NCCL, one that died: gloo sees the closed connection
at once) stops the others after that long, with an error, instead of freezing the run.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch

from tracerl.errors import UserError


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        """Rank 0: the one that drives rollouts and writes the run directory."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def launched() -> Ranks:
    """The ranks torchrun (or any launcher with its variables) gave this process."""

    def number(name: str, default: int) -> int:
        raw = os.environ.get(name)
        if raw is None:
            return default
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None

    ranks = Ranks(number("RANK", 0), number("WORLD_SIZE", 1), number("LOCAL_RANK", 0))
    if not 0 <= ranks.rank < ranks.world_size:
        raise ValueError(f"RANK={ranks.rank} is outside WORLD_SIZE={ranks.world_size}")
    return ranks


def device_of(ranks: Ranks, device: str) -> torch.device:
    """Where this rank's learner runs: its own GPU (``LOCAL_RANK``), or the CPU (the rule of
    `tracerl.models.placement.resolve_device`, which places the rank's model)."""
    from tracerl.models.placement import resolve_device

    placed = resolve_device(device)
    return torch.device("cuda", ranks.local_rank) if placed.type == "cuda" else placed


def init_process_group(ranks: Ranks, device: torch.device, timeout_s: float) -> None:
    """Join the launch's process group (a no-op if already joined or alone)."""
    import torch.distributed as dist

    if not ranks.distributed or dist.is_initialized():
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        rank=ranks.rank,
        world_size=ranks.world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def close_process_group() -> None:
    """Leave the group; every rank first waits for the others (gloo aborts a process that
    leaves while a peer still talks to it)."""
    import torch.distributed as dist

    if dist.is_initialized():
        try:
            dist.barrier()
        finally:
            dist.destroy_process_group()


RESUME_HINT = (
    "the newest checkpoint is whole: run the same torchrun command with --resume to "
    "continue from it (episodes already written are reused)"
)


class RankLost(UserError, RuntimeError):
    """A learner collective failed: another rank stopped, or lost its connection. Printed
    without a traceback (it is not rank 0's bug), with how to resume."""

    def __init__(self, message: str) -> None:
        super().__init__(message, RESUME_HINT)
        _lost[0] = True  # torchrun's SIGTERM that follows must not cut the message short


_lost = [False]


def rank_lost() -> bool:
    """Whether this process has met a `RankLost`: it is on its way out, saying why."""
    return _lost[0]


def is_collective_failure(e: BaseException) -> bool:
    """A failure of torch.distributed's transport (a peer gone, a timeout), not of the
    computation around it."""
    import torch.distributed as dist

    if isinstance(e, dist.DistError):
        return True
    text = str(e)
    return any(k in text for k in ("gloo", "NCCL", "Connection closed", "Connection reset"))


class LaunchError(UserError, ValueError):
    """The launch and the config disagree (processes vs strategy)."""
