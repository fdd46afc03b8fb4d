"""Ctrl-C during a run: the first one is acknowledged at once and stops the run at its phase's
next safe point; a second one aborts at once.

Safe points, by phase:

* rollouts (the baseline evaluation, the warm start's reference episodes, a step's episodes,
  any evaluation) are cancelled where they are: every finished episode is on disk already
  and ``--resume`` reuses it (an evaluation is redone whole);
* computation that changes the weights (the warm start's fine-tuning, a step's update)
  finishes, and a checkpoint is written.

Either way the run prints the command that resumes it and exits 0. SIGTERM is a first
Ctrl-C. The second Ctrl-C exits with status 130 at once, leaving what ``kill -9`` would:
nothing corrupt (files are written under temporary names and renamed; a vLLM server dies
with its trainer), the episodes finished so far reused by ``--resume``.

The handlers are installed once the run has started (its model loaded, its engine up).
Before that there is nothing to finish: Ctrl-C is Python's KeyboardInterrupt (`starting`), which
`tracerl.train.loop.train` reports (was the run folder written?) and the command ends with
status 130.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from collections.abc import Awaitable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")
POLL_S = 0.1
ABORT_STATUS = 130  # 128 + SIGINT, as shells report a process Ctrl-C killed


class StopRun(Exception):
    """A stop was requested; raised at the next safe point of `phase`."""

    def __init__(self, phase: str) -> None:
        super().__init__(f"stopped by a signal during {phase}")
        self.phase = phase


class Interrupts:
    """The run's SIGINT/SIGTERM handlers while it is in a ``with`` block (main thread only:
    elsewhere signals cannot be caught, and nothing is installed). `phase` says what is
    running, for the acknowledgement; `requested` is read at the safe points."""

    current: Interrupts | None = None

    def __init__(self, resume_command: str) -> None:
        self.resume_command = resume_command
        self.requested = False
        self.phase = "start-up"
        self._old: dict[int, Any] = {}

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        Interrupts.current = self
        return self

    def __exit__(self, *exc: Any) -> None:
        Interrupts.current = None
        for sig, handler in self._old.items():
            signal.signal(sig, handler)

    def stopped(self, when: str) -> str:
        """The line a stopped run ends with: when it stopped, and how to resume it."""
        return f"stopped by a signal {when}. Resume with: {self.resume_command}"

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested and signum == signal.SIGINT:
            _say("\nCtrl-C again: aborting now (--resume reuses the episodes already written)\n")
            os._exit(ABORT_STATUS)
        first = not self.requested
        self.requested = True
        if first:
            _say(
                f"\n{signal.Signals(signum).name}: stopping at the next safe point of "
                f"{self.phase} (rollouts stop at once; fine-tuning or an update under way "
                "finishes, then a checkpoint); Ctrl-C again to abort now\n"
            )


@contextlib.contextmanager
def starting() -> Iterator[None]:
    """While a run starts, before `Interrupts`: Ctrl-C is a KeyboardInterrupt, even in a
    process that inherited SIGINT ignored (a background job of a script, a test runner's
    worker), as it is a stop request once the run's own handlers are in (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def _say(text: str) -> None:
    # straight to the file descriptor: a handler must not wait on a console's lock
    with contextlib.suppress(OSError):
        os.write(2, text.encode())


def set_phase(phase: str) -> None:
    if Interrupts.current is not None:
        Interrupts.current.phase = phase


async def cancellable(work: Awaitable[T]) -> T:
    """`work` run to its end, or cancelled as soon as a stop is requested (then `StopRun`):
    for rollouts, whose finished episodes are on disk already."""
    task = asyncio.ensure_future(work)
    current = Interrupts.current
    if current is None:
        return await task
    while not task.done():
        await asyncio.wait({task}, timeout=POLL_S)
        if current.requested and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            raise StopRun(current.phase)
    return task.result()
