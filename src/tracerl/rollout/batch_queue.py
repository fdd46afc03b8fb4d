"""The asynchronous front of a batching sampler: episodes' requests in, batches out.

Many episodes await `sample(request)` at once; one worker coroutine per event loop collects
the requests that are waiting (those issued in the same few event-loop ticks, or within
`gather_s` of each other, at most `max_batch_size`) and hands them to `_decode` in a worker
thread, so the event loop and the environments keep running while the batch decodes. Turns
that arrive meanwhile are handed to the running batch through `admit` (continuous batching),
and each caller gets its result through `deliver` the moment its row ends, not when the
batch drains.

Who owns a failure: a request that fails its batch is retried alone, so one bad request
fails only its own caller; a failure of the worker itself (not of a batch) fails every
caller still waiting, at once, and the next request starts a new worker. Nothing ever
leaves a caller waiting for a worker that is gone.

A subclass provides the model side: `_decode(requests, admit=, deliver=)` (one batch,
synchronous, in the worker thread) and `generate_batch(requests)`
(`tracerl.rollout.batched.BatchedHFSampler`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence
from typing import Any

from tracerl.rollout.sampler import SampleRequest, SampleResult

Pending = tuple[SampleRequest, "asyncio.Future[SampleResult]"]
log = logging.getLogger(__name__)


class BatchQueue:
    """Waiting requests, served in batches by one worker per event loop."""

    gather_ticks = 4  # event-loop ticks to wait so requests issued together share a batch
    continuous = True
    """Turns that arrive while a batch decodes join it (continuous batching); False: they
    wait for the next batch (static batching: `benchmarks/continuous_batching.py` compares)."""
    gather_s = 0.0
    """Seconds to wait for more requests after one arrives (see `_gather_stragglers`); 0:
    only `gather_ticks` (requests of in-process episodes arrive in the same ticks)."""

    def __init__(self, max_batch_size: int) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.max_batch_size = max_batch_size
        self._pending_lock = threading.Lock()  # `sample` adds on the loop, a batch takes too
        self._loop: asyncio.AbstractEventLoop | None = None
        self._worker: asyncio.Task[None] | None = None
        self._wakeup: asyncio.Event | None = None
        self._pending: list[Pending] = []

    def generate_batch(self, requests: Sequence[SampleRequest]) -> list[SampleResult]:
        """Sample every request's turn together (synchronous)."""
        raise NotImplementedError

    def _decode(
        self, requests: list[SampleRequest], *, admit: Any = None, deliver: Any = None
    ) -> list[SampleResult]:
        """One batch, in the worker thread: `admit(room, fits)` hands over requests that
        arrived since (those `fits` accepts), `deliver(i, result)` answers the i-th request
        served as its row ends."""
        raise NotImplementedError

    async def sample(self, request: SampleRequest) -> SampleResult:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._worker is None or self._worker.done():
            self._start_worker(loop)
        assert self._wakeup is not None
        fut: asyncio.Future[SampleResult] = loop.create_future()
        with self._pending_lock:
            self._pending.append((request, fut))
        self._wakeup.set()
        return await fut

    def _start_worker(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._loop is not loop:  # futures of a previous (finished) loop have no waiters
            self._pending = []
        self._loop = loop
        self._wakeup = asyncio.Event()
        self._worker = loop.create_task(self._run(self._wakeup), name="BatchedHFSampler")

    async def _run(self, wakeup: asyncio.Event) -> None:
        try:
            while True:
                if not self._pending:
                    wakeup.clear()
                    await wakeup.wait()
                    continue
                for _ in range(self.gather_ticks):
                    await asyncio.sleep(0)
                await self._gather_stragglers()
                batch = self._take(self.max_batch_size)
                if batch:
                    await self._serve(batch)
        except Exception as exc:
            # the worker itself broke (not a batch: `_serve` answers those): every caller
            # still waiting gets the error now, instead of waiting for a worker that is
            # gone; the next `sample` starts a new one
            log.exception("BatchedHFSampler's worker failed; failing the waiting requests")
            with self._pending_lock:
                waiting, self._pending = self._pending, []
            error = RuntimeError(f"the batched sampler's worker failed: {exc!r}")
            error.__cause__ = exc
            for _, fut in waiting:
                _settle(fut, error)
            raise

    async def _gather_stragglers(self) -> None:
        """With `gather_s` > 0: wait while requests keep arriving (each wait `gather_s`,
        all of them at most 10 x `gather_s`), so turns that arrive milliseconds apart
        (over HTTP, from many threads: the gateway's agents) share one batch."""
        if self.gather_s <= 0:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10 * self.gather_s
        seen = len(self._pending)
        while seen < self.max_batch_size and loop.time() < deadline:
            await asyncio.sleep(self.gather_s)
            if len(self._pending) == seen:
                return
            seen = len(self._pending)

    async def _serve(self, batch: list[Pending]) -> None:
        """Run `batch` in a worker thread; turns that arrive meanwhile join it (`_admit`)
        while it has room, and each caller gets its turn the moment its row finishes."""
        loop = asyncio.get_running_loop()
        futures = [fut for _, fut in batch]  # index i: the i-th request the batch served

        def admit(room: int, fits: Any = None) -> list[SampleRequest]:
            taken = self._take(room, fits)
            futures.extend(fut for _, fut in taken)
            return [req for req, _ in taken]

        def deliver(i: int, out: SampleResult | Exception) -> None:
            loop.call_soon_threadsafe(_settle, futures[i], out)

        try:
            await asyncio.to_thread(
                self._generate_isolated,
                [req for req, _ in batch],
                admit if self.continuous else None,
                deliver,
            )
        except asyncio.CancelledError:
            for fut in futures:
                fut.cancel()
            raise
        except Exception as exc:  # never leave a caller waiting
            for fut in futures:
                _settle(fut, exc)

    def _take(self, n: int, fits: Any = None) -> list[Pending]:
        """Up to `n` waiting requests whose callers still wait, oldest first; with `fits`,
        only those it accepts (the others keep their place in the queue)."""
        with self._pending_lock:
            taken: list[Pending] = []
            left: list[Pending] = []
            for k, (req, fut) in enumerate(self._pending):
                if len(taken) == n:  # the rest keep their places, unread
                    left += self._pending[k:]
                    break
                if fut.done():
                    continue
                if fits is None or fits(req):
                    taken.append((req, fut))
                else:
                    left.append((req, fut))
            self._pending = left
            return taken

    def _generate_isolated(
        self,
        requests: list[SampleRequest],
        admit: Any = None,
        deliver: Any = None,
    ) -> list[SampleResult | Exception]:
        """The batch's results (each also handed to `deliver(i, result)` as its row ends);
        if the batch fails, each request not yet answered alone, failures as exceptions."""
        served = list(requests)

        def joined(room: int, fits: Any = None) -> list[SampleRequest]:
            new = admit(room, fits) if admit is not None else []
            served.extend(new)
            return new

        answered: dict[int, SampleResult | Exception] = {}

        def settle(i: int, out: SampleResult | Exception) -> None:
            answered[i] = out
            if deliver is not None:
                deliver(i, out)

        try:
            self._decode(requests, admit=joined, deliver=settle)
        except Exception as exc:
            if len(served) == 1 and not answered:
                settle(0, exc)
            for i, req in enumerate(served):
                if i in answered:
                    continue
                try:
                    settle(i, self.generate_batch([req])[0])
                except Exception as alone:
                    settle(i, alone)
        return [answered[i] for i in range(len(served))]


def _settle(fut: asyncio.Future[SampleResult], out: SampleResult | Exception) -> None:
    if fut.done():  # the caller gave up (cancelled)
        return
    if isinstance(out, Exception):
        fut.set_exception(out)
    else:
        fut.set_result(out)
