"""Connections by server: the worker's shared ones (``scope: worker``), an episode's own
(``scope: episode``), and the tool listing an environment is built from before any episode.
All of them live on the hub (`tracerl.envs.mcp.hub`)."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import hashlib
import json

from tracerl.envs.mcp.client import Connection, Listing
from tracerl.envs.mcp.config import McpServer
from tracerl.envs.mcp.hub import at_new_hub, owned, run_sync

_POOL: dict[str, Connection] = {}
_LOCKS: dict[str, asyncio.Lock] = {}  # used on the hub's loop only
_LISTINGS: dict[str, Listing] = {}


def key(server: McpServer) -> str:
    text = json.dumps(server.model_dump(mode="json"), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


async def shared(server: McpServer) -> Connection:
    """The worker's connection to `server` (on the hub), opened again if it died. One
    opener at a time per server: concurrent episodes wait for it and share it."""
    k = key(server)
    lock = _LOCKS.setdefault(k, asyncio.Lock())
    async with lock:
        conn = _POOL.get(k)
        if conn is not None and conn.alive():
            return conn
        if conn is not None:
            _POOL.pop(k, None)
            await conn.close(grace_s=2.0)
        conn = Connection(server)
        _LISTINGS[k] = await conn.open()
        _POOL[k] = conn
        return conn


async def fresh(server: McpServer) -> Connection:
    """A new connection of its own (an episode's), open."""
    conn = Connection(server)
    await conn.open()
    return conn


def listing(server: McpServer, opened: McpServer | None = None) -> Listing:
    """The server's tools, for building an environment before any episode: the worker's
    connection's, a listing already read in this process, or one read now (from `opened`:
    the server with placeholders filled for a listing, when its start has any)."""
    k = key(server)
    if k in _LISTINGS:
        return _LISTINGS[k]

    async def read() -> Listing:
        if server.scope == "worker":
            return (await shared(server)).listing  # type: ignore[return-value]
        conn = await fresh(opened or server)
        await conn.close()
        return conn.listing  # type: ignore[return-value]

    _LISTINGS[k] = run_sync(read(), server.connect_timeout_s + 15)
    return _LISTINGS[k]


def close_all() -> None:
    """At exit: close the worker's connections (their stdio servers end)."""
    if not _POOL or not owned():
        return

    async def close() -> None:
        conns = list(_POOL.values())
        _POOL.clear()
        await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)

    with contextlib.suppress(Exception):
        run_sync(close(), 15)


def forget() -> None:
    """In a forked child: the parent's connections are not this process's to use."""
    _POOL.clear()
    _LOCKS.clear()


def _on_new_hub(forked: bool) -> None:
    if forked:  # the parent's connections are not this process's
        forget()
    atexit.register(close_all)


at_new_hub(_on_new_hub)
