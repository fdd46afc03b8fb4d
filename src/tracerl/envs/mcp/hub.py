"""The hub: one daemon thread running one event loop per process, where every MCP
connection lives (`tracerl.envs.mcp.client` says why). Callers on any loop (or none) hand
it coroutines and await, or wait for, the answer.

What a process keeps on the hub beyond one call (the worker's pooled connections,
`tracerl.envs.mcp.pool`) registers `at_new_hub`: told when a hub starts, and whether it
replaces a forked parent's (whose connections are not this process's to use).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any


class _Hub:
    """A daemon thread running one event loop for every MCP connection of this process."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name="tracerl-mcp", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)


_hub: _Hub | None = None
_hub_lock = threading.Lock()
_on_new_hub: list[Callable[[bool], None]] = []


def at_new_hub(hook: Callable[[bool], None]) -> None:
    """Call `hook(forked)` whenever this process starts a hub (now, if one is running):
    `forked` when it replaces the hub of the parent this process was forked from."""
    with _hub_lock:
        _on_new_hub.append(hook)
        if _hub is not None and _hub.pid == os.getpid():
            hook(False)


def hub() -> _Hub:
    global _hub
    with _hub_lock:
        if _hub is None or _hub.pid != os.getpid():  # none yet, or a forked child
            forked = _hub is not None  # the parent's connections are not this process's
            _hub = _Hub()
            for hook in _on_new_hub:
                hook(forked)
        return _hub


async def on_hub(coro: Coroutine[Any, Any, Any], timeout: float | None = None) -> Any:
    """Run `coro` on the hub and await its result from the caller's loop."""
    fut = hub().submit(coro)
    try:
        return await asyncio.wait_for(asyncio.wrap_future(fut), timeout)
    except (asyncio.CancelledError, TimeoutError):
        fut.cancel()
        raise


def owned() -> bool:
    """Whether this process's hub is running (connections exist that are this process's)."""
    return _hub is not None and _hub.pid == os.getpid()


def run_sync(coro: Coroutine[Any, Any, Any], timeout: float) -> Any:
    """Run `coro` on the hub and wait for it here (code that is not async: an env's
    constructor, `check_env`). Safe inside a running loop: the hub is another thread."""
    fut = hub().submit(coro)
    try:
        return fut.result(timeout)
    except concurrent.futures.TimeoutError:
        fut.cancel()
        raise TimeoutError(f"no answer in {timeout:g} s") from None
