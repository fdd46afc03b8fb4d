"""A training run over several learner processes: rank 0 drives, the others learn.

Under ``torchrun --nproc-per-node N -m tracerl train CONFIG``, every process reads the same
config. Rank 0 runs `tracerl.train.loop.train` as a single process would: rollouts, the
episodes, metrics, checkpoints, evaluation and the report, and with the Ray backend the
Ray driver. The other ranks hold a learner only (`follow`): each call rank 0's learner
makes (create, update, gather the optimizer's state for a checkpoint, load a checkpoint,
stop) is first broadcast to them on a `Channel`, and they make the same call, so the
collectives inside it pair up.

A rank that dies ends the run: torchrun stops the other processes, and rank 0's next
collective fails (at once with gloo, which sees the connection close; with NCCL after its
watchdog, at most `timeout_s`): rank 0 reports a `RankLost` and exits. torchrun's SIGTERM
comes at once too; during the loop it asks for a stop after the step (whose collective then
fails), and once a `RankLost` is on its way out it is ignored, so that the message (and
how to resume) is always printed, whichever of the two comes first.
The newest checkpoint is whole (checkpoints are written atomically, `tracerl.train.
checkpoint`), so ``--resume`` continues from it, reusing every episode already written.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
from collections.abc import Iterator
from typing import Any

from tracerl.train.distributed.ranks import (
    LaunchError,
    RankLost,
    Ranks,
    close_process_group,
    init_process_group,
    launched,
    rank_lost,
)
from tracerl.train.distributed.strategy import Strategy, make_strategy


class Channel:
    """Rank 0's learner calls, broadcast to the other ranks on a gloo group of their own
    (also beside NCCL: the calls are small Python objects). Its timeout is the longest
    the other ranks wait for the next call: rollouts and evaluations run in between."""

    def __init__(self, ranks: Ranks, wait_timeout_s: float) -> None:
        import torch.distributed as dist

        self.ranks = ranks
        self.group = dist.new_group(
            backend="gloo", timeout=datetime.timedelta(seconds=wait_timeout_s)
        )

    def send(self, command: str, *args: Any) -> None:
        import torch.distributed as dist

        try:
            dist.broadcast_object_list([(command, args)], src=0, group=self.group)
        except RuntimeError as e:
            raise RankLost(f"a learner rank stopped (before the learner's {command!r}): {e}") from e

    def receive(self) -> tuple[str, tuple[Any, ...]]:
        import torch.distributed as dist

        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]


class Launch:
    """This process's part in the run: its ranks, the learner strategy, rank 0's channel."""

    def __init__(
        self, ranks: Ranks, strategy: str = "single", channel: Channel | None = None
    ) -> None:
        self.ranks = ranks
        self.strategy_name = strategy
        self.channel = channel

    def strategy(self) -> Strategy:
        return make_strategy(self.strategy_name, self.ranks)


_current: list[Launch] = [Launch(Ranks())]


def current() -> Launch:
    """The launch this process is part of (one process of one, outside ``torchrun``)."""
    return _current[-1]


@contextlib.contextmanager
def launch(cfg: Any) -> Iterator[Launch]:
    """Join the process group torchrun set up (nothing, for one process) for the run of
    `cfg`; on the way out rank 0 tells the others to stop, and every rank leaves."""
    ranks = launched()
    learner = cfg.trainer.learner
    if not ranks.distributed:
        yield current()
        return
    if learner.strategy == "single":
        raise LaunchError(
            f"launched as {ranks.world_size} processes but trainer.learner.strategy is 'single'",
            "set trainer.learner.strategy=ddp (or fsdp2), or launch one process",
        )
    from tracerl.train.distributed.ranks import device_of

    init_process_group(ranks, device_of(ranks, cfg.model.device), learner.timeout_s)
    here = Launch(ranks, learner.strategy, Channel(ranks, learner.wait_timeout_s))
    _current.append(here)
    try:
        with _quiet_once_lost():
            yield here
    except BaseException:
        # no "stop", no barrier: the other ranks may be inside a collective this process
        # will never join; its exit closes the connections, which ends theirs
        _current.pop()
        raise
    _current.pop()
    if ranks.main:
        here.channel.send("stop")
    close_process_group()


@contextlib.contextmanager
def _quiet_once_lost() -> Iterator[None]:
    """SIGTERM and SIGINT act as before, unless a `RankLost` is already on its way out:
    then they are ignored (torchrun sends SIGTERM as soon as it sees a rank die, and the
    default action would end this process before it says which rank and how to resume)."""
    old = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def handle(signum: int, frame: Any) -> None:
        if rank_lost():
            return
        before = old[signal.Signals(signum)]
        if callable(before):
            before(signum, frame)
        elif before != signal.SIG_IGN:  # the default action, as if never caught
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    for sig in old:
        signal.signal(sig, handle)
    try:
        yield
    finally:
        if not rank_lost():  # else kept until the process ends, after the message
            for sig, handler in old.items():
                signal.signal(sig, handler)


def follow(run: Any, log: Any = print) -> None:
    """A learner rank (not rank 0): build the model as rank 0 does (`run`: the rank's
    `tracerl.train.run.Run`, built from the same config), then make rank 0's learner calls
    until it says stop."""
    here = current()
    channel = here.channel
    assert channel is not None and not here.ranks.main
    run.bundle  # noqa: B018  (the model, built before rank 0's first call)
    log(f"rank {here.ranks.rank}/{here.ranks.world_size}: learner ({here.strategy_name})")
    # Ctrl-C and torchrun's SIGTERM reach every rank: rank 0 finishes its step and writes
    # a checkpoint (which needs this rank's shards), then says stop
    old = {sig: signal.signal(sig, _noted) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        _follow(channel, here, run)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _noted(signum: int, frame: Any) -> None:
    """A learner rank stops when rank 0 says so (or is gone), not on a signal."""


def _follow(channel: Channel, here: Launch, run: Any) -> None:
    learner = None
    while True:
        command, args = channel.receive()
        if command == "stop":
            return
        if command == "init":
            learner = run.learner(follower=True)
            continue
        if learner is None:
            raise RuntimeError(f"rank {here.ranks.rank}: {command!r} before the learner exists")
        if command == "update":
            trajectories, advantages, lr_scale, weights = args
            learner.apply_update(trajectories, advantages, lr_scale=lr_scale, weights=weights)
        elif command == "optimizer_state":
            learner.optimizer_state()
        elif command == "load":
            learner.load_state(None)
        else:
            raise RuntimeError(f"rank {here.ranks.rank}: unknown learner call {command!r}")
