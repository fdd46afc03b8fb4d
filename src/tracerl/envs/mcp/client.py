"""Connections to MCP servers, owned by one background event loop per process.

The `mcp` SDK's client must be entered and left in one task, and its connection lives on
the event loop that opened it. Episodes run on whatever loop their caller has (a training
step's, an evaluation's, a Ray worker's), and a worker-scoped connection outlives them all.
So every connection lives on the *hub* (`tracerl.envs.mcp.hub`): one daemon thread running
one event loop, where each connection is a task that holds the SDK's ``async with
Client(...)`` until it is told to close. Callers on any loop (or none) hand the hub
coroutines and await the answer.

A stdio server is started through `tracerl.engines.guard` in ``--parent`` mode, so it ends
with this process however the process ends (``kill -9`` included); its stderr goes to a
temporary file whose tail explains a server that would not start or died.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracerl.envs.mcp.config import McpServer, expand

# the hub has a module of its own; its names stay importable from here
from tracerl.envs.mcp.hub import hub as hub
from tracerl.envs.mcp.hub import on_hub as on_hub
from tracerl.envs.mcp.hub import owned as owned
from tracerl.envs.mcp.hub import run_sync as run_sync

log = logging.getLogger("tracerl")
_STDERR_TAIL = 1500
# an HTTP server's client with headers (`McpServer.headers`): the MCP SDK's own timeouts,
# 30 s to connect, write or wait for the pool and 300 s to read (a stream may stay open)
_HTTP_TIMEOUT_S = 30.0
_HTTP_READ_TIMEOUT_S = 300.0


class McpUnavailable(Exception):
    """The server cannot be reached: it would not start, died, or the connection broke."""


@dataclass(frozen=True)
class Listing:
    """What a server said about itself and its tools when a connection opened."""

    identity: dict[str, Any]
    """The server label, transport, the name and version it reported, the protocol."""
    tools: tuple[Any, ...]
    """The server's tools (``mcp_types.Tool``: name, description, input_schema,
    annotations), in its order."""


def import_mcp() -> Any:
    try:
        import mcp
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError("MCP tools need the `mcp` package: pip install 'tracerl[mcp]'") from e
    return mcp


class Connection:
    """One client session with one server. `open`, `call` and `close` run on the hub."""

    def __init__(self, server: McpServer) -> None:
        self.server = server
        self.client: Any = None
        self.listing: Listing | None = None
        self.dead: str | None = None  # why the connection cannot be used, once it cannot
        self._closing: asyncio.Event | None = None
        self._owner: asyncio.Task[None] | None = None
        self._errlog: Any = None
        self._pidfile: Path | None = None

    # ---- on the hub ------------------------------------------------------------------------
    async def open(self) -> Listing:
        self._closing = asyncio.Event()
        ready: asyncio.Future[Listing] = asyncio.get_running_loop().create_future()
        self._owner = asyncio.create_task(self._own(ready))
        try:
            return await asyncio.wait_for(asyncio.shield(ready), self.server.connect_timeout_s)
        except TimeoutError:
            self.dead = f"no answer in {self.server.connect_timeout_s:g} s (connect_timeout_s)"
            why = self._why("did not start")  # before close() drops the stderr file
            await asyncio.shield(self.close(grace_s=0.0))
            raise McpUnavailable(why) from None
        except BaseException:  # McpUnavailable, or the caller cancelled: end what started
            await asyncio.shield(self.close(grace_s=0.0))
            raise

    async def _own(self, ready: asyncio.Future[Listing]) -> None:
        mcp = import_mcp()
        try:
            async with contextlib.AsyncExitStack() as stack:
                transport = await self._transport(mcp, stack)
                client = await stack.enter_async_context(
                    mcp.Client(
                        transport,
                        read_timeout_seconds=self.server.timeout_s,
                        cache=None,  # a listing is read fresh: it is what versions the tools
                        client_info=_client_info(),
                    )
                )
                self.client = client
                listing = Listing(_identity(self.server, client), tuple(await _tools(client)))
                self.listing = listing
                if not ready.done():
                    ready.set_result(listing)
                assert self._closing is not None
                await self._closing.wait()
        except BaseException as e:  # the owner ends: remember why, tell a waiting opener
            if not (self._closing is not None and self._closing.is_set()):
                self.dead = self.dead or describe(e)
            if not ready.done():
                ready.set_exception(McpUnavailable(self._why("could not be reached")))
            if isinstance(e, asyncio.CancelledError | KeyboardInterrupt | SystemExit):
                raise
        finally:
            self.dead = self.dead or "closed"
            self.client = None

    async def _transport(self, mcp: Any, stack: contextlib.AsyncExitStack) -> Any:
        s = self.server
        if s.url is not None:
            from mcp.client.streamable_http import streamable_http_client

            headers = {k: expand(v, f"{s.where()}: headers.{k}") for k, v in s.headers.items()}
            if not headers:
                return streamable_http_client(s.url)
            import httpx2  # the SDK's HTTP client; headers go through one of our own

            # the SDK's default timeouts (a response stream may stay open for minutes), set
            # here: its own factory is private; closed with the owner
            timeout = httpx2.Timeout(_HTTP_TIMEOUT_S, read=_HTTP_READ_TIMEOUT_S)
            http = await stack.enter_async_context(
                httpx2.AsyncClient(headers=headers, timeout=timeout)
            )
            return streamable_http_client(s.url, http_client=http)
        from mcp.client.stdio import stdio_client

        assert s.command is not None
        command = list(s.command)
        if command[0] in ("python", "python3"):
            command[0] = sys.executable
        # the guard ends the server with this process, kill -9 included; it writes the
        # server's pid, so a server that died is known before a call finds out
        guard = [sys.executable, "-m", "tracerl.engines.guard", "--parent", str(os.getpid())]
        env = {k: expand(v, f"{s.where()}: env.{k}") for k, v in s.env.items()}
        if "PYTHONPATH" in os.environ and "PYTHONPATH" not in env:
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]  # how this process found tracerl
        # the guard writes the server's pid here (empty until then); removed by close(), or
        # by the guard when it stops the server because this process is gone
        fd, pidfile = tempfile.mkstemp(prefix="tracerl-mcp-", suffix=".pid")
        os.close(fd)
        self._pidfile = Path(pidfile)
        params = mcp.StdioServerParameters(
            command=guard[0],
            args=[*guard[1:], str(self._pidfile), "--", *command],
            env=env,
            cwd=s.cwd or os.getcwd(),
        )
        self._errlog = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115 - closed by close()
        return stdio_client(params, errlog=self._errlog)

    def alive(self) -> bool:
        """Open, and (stdio) its server still running: a pooled connection worth reusing."""
        if self.dead is not None or self.client is None:
            return False
        if self._owner is not None and self._owner.done():
            return False
        if self._pidfile is None:
            return True
        try:
            pid = int(self._pidfile.read_text())
        except (OSError, ValueError):
            return True  # not written yet: the guard has only just started it
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except (OSError, IndexError):
            return False

    async def call(self, name: str, arguments: dict[str, Any], timeout: float) -> Any:
        if not self.alive():
            self.dead = self.dead or "the server process exited"
            raise McpUnavailable(self._why("is not connected"))
        try:
            return await self.client.call_tool(name, arguments, read_timeout_seconds=timeout)
        except Exception as e:
            if _connection_lost(e) or not self.alive():
                self.dead = self.dead or describe(e)
                raise McpUnavailable(self._why("lost its connection")) from None
            raise

    async def close(self, grace_s: float = 10.0) -> None:
        """End the connection (a stdio server: stdin closed, then the SDK's kill)."""
        if self._closing is not None:
            self._closing.set()
        if self._owner is not None and not self._owner.done():
            try:  # an owner still starting is not waiting to be told: cancel it
                waiting = self.listing is not None
                await asyncio.wait_for(asyncio.shield(self._owner), grace_s if waiting else 0)
            except (TimeoutError, Exception):
                self._owner.cancel()
                with contextlib.suppress(BaseException):
                    await self._owner
        if self._errlog is not None:
            with contextlib.suppress(Exception):
                self._errlog.close()
            self._errlog = None
        if self._pidfile is not None:
            with contextlib.suppress(OSError):
                self._pidfile.unlink(missing_ok=True)

    # ---- what went wrong -------------------------------------------------------------------
    def _why(self, what: str) -> str:
        text = f"{self.server.where()} {what}: {self.dead or 'unknown error'}"
        tail = self.stderr_tail()
        return f"{text}; its stderr ends: {tail}" if tail else text

    def stderr_tail(self) -> str:
        f = self._errlog
        if f is None:
            return ""
        try:
            f.flush()
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - _STDERR_TAIL * 4))
            text = f.read()
        except Exception:
            return ""
        lines = [ln for ln in text.strip().splitlines() if ln.strip()]
        return " | ".join(lines[-6:])[-_STDERR_TAIL:]


async def _tools(client: Any) -> list[Any]:
    out, cursor = [], None
    for _ in range(100):  # pages
        page = await client.list_tools(cursor=cursor)
        out.extend(page.tools)
        cursor = page.next_cursor
        if not cursor:
            break
    return out


def _client_info() -> Any:
    import mcp_types

    from tracerl import __version__

    return mcp_types.Implementation(name="tracerl", version=__version__)


def _identity(server: McpServer, client: Any) -> dict[str, Any]:
    info = client.server_info
    return {
        "server": server.name,
        "transport": server.transport,
        "name": getattr(info, "name", None),
        "version": getattr(info, "version", None),
        "protocol": client.protocol_version,
        "scope": server.scope,
    }


def describe(e: BaseException) -> str:
    """One line for an exception, looking inside the SDK's exception groups."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    text = str(e).strip()
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _connection_lost(e: BaseException) -> bool:
    """The transport is gone (a broken stream, an HTTP connection refused, the SDK's own
    "Connection closed"), as opposed to an error the server answered with or a timeout."""
    import anyio

    if isinstance(e, BaseExceptionGroup):
        return any(_connection_lost(x) for x in e.exceptions)
    if type(e).__name__ == "MCPError":  # -32000 is also a server's own error range
        return getattr(e, "code", None) == -32000 and getattr(e, "message", "") == (
            "Connection closed"
        )
    closed = (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream)
    if isinstance(e, closed) or (isinstance(e, OSError) and not isinstance(e, TimeoutError)):
        return True
    return type(e).__module__.split(".")[0] in ("httpx", "httpx2", "httpcore", "httpcore2")
