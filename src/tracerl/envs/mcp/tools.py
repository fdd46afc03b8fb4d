"""An MCP server's tools as tracerl tools: `McpTools`.

    class Notes(ToolEnv):
        def __init__(self, **kw):
            super().__init__(**kw)
            self.use(McpTools(McpServer(name="kv", command=["python", "-m", "kv_server"])))

or, without code, ``env.mcp`` in a run config (`tracerl.envs.mcp.attach`).

What each tool is, from the server's annotations (or the config's, which win):

* ``readOnlyHint: true`` -> a read: always executed;
* anything else -> a write: it counts against ``budgets.write_actions``, a task must allow
  write actions (``effect: write``) for it to run at all, and it runs as a dry run unless
  the environment's guard is off *and* the task sets ``allow_real_writes``. MCP has no dry-run
  mode, so each write tool says how it is dry-run (`McpServer.dry_run`): refused with an
  observation that says it was not executed (the default), a preview tool, or a boolean
  argument. Nothing is ever executed for real under the guard.

A call's arguments are checked against the tool's JSON schema before anything is sent (a
call the schema refuses is the policy's ``invalid_arguments``); the arguments tracerl sets
(``inject``, a dry-run flag) are not in the schema the model sees, and a value it sends for
one is dropped first. A result with ``isError`` is an ordinary observation. A server that
will not start, dies, times out or answers with a protocol error is the environment's
fault, retried when a retry is safe (reads, and writes the server marks idempotent). A
tool's version is ``<server>@<server version>#<schema hash>``: a server upgrade or a
changed schema shows in receipts and live replays.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from tracerl.envs.mcp import client as mc
from tracerl.envs.mcp import pool
from tracerl.envs.mcp.config import (
    McpServer,
    as_server,
    dry_run_mode,
    episode_values,
    matching,
    unmatched,
)
from tracerl.envs.mcp.schema import (
    check_dry_run,
    check_schema,
    effective_hints,
    model_name,
    result_text,
    schema_hash,
    schema_problems,
    unannotated_warning,
    without,
)
from tracerl.envs.tools import Tool, ToolResult
from tracerl.types import Fault, FaultKind

START_ATTEMPTS = 3
"""Tries to start (connect to) a server at an episode's start before it is an infra failure."""
LISTING_EPISODE = "listing"
"""The episode id tools are listed under before any episode (task fields fill as "")."""
log = logging.getLogger("tracerl")
_WARNED: set[str] = set()


@dataclass(frozen=True)
class McpTool(Tool):
    """One tool of an MCP server (build them with `McpTools`)."""

    remote: str = ""
    """The tool's name on the server (the model may see it prefixed)."""
    hints: dict[str, Any] = field(default_factory=dict)
    """The annotations in force (the server's, overridden by the config's)."""
    dry_run_how: str = "refuse"
    box: Any = field(default=None, repr=False, compare=False)

    def receipt_schema(self) -> dict[str, Any]:
        return {
            **super().receipt_schema(),
            "x-mcp": {
                "server": self.box.server.name,
                "tool": self.remote,
                "annotations": self.hints,
                "dry_run": self.dry_run_how if self.effect == "write" else None,
                "injected": sorted(matching(self.remote, self.box.server.inject) or ()),
            },
        }

    def hidden(self) -> set[str]:
        """The arguments tracerl sets on every call, not the model: those `inject` sets, and
        a write's dry-run flag (``dry_run: argument:NAME``). They are not in `parameters`."""
        out = set(matching(self.remote, self.box.server.inject) or ())
        mode, arg = dry_run_mode(self.dry_run_how)
        if self.effect == "write" and mode == "argument":
            out.add(str(arg))
        return out

    def validate(self, arguments: Any) -> dict[str, Any] | Fault:
        """The model's arguments checked against the schema it was shown. A value it sends
        for a hidden argument is dropped first, not refused (a server whose schema forbids
        other properties would refuse it): tracerl sets that argument itself."""
        if not isinstance(arguments, dict):
            return Fault(FaultKind.INVALID_ARGUMENTS, f"{self.name}: arguments must be an object")
        hidden = self.hidden()
        arguments = {k: v for k, v in arguments.items() if k not in hidden}
        try:
            problems = schema_problems(self.parameters, arguments)
        except Exception as e:  # a schema the validator cannot apply: the server's problem
            message = f"{self.name}: its input schema cannot be applied ({mc.describe(e)})"
            return Fault(FaultKind.SERVER_ERROR, message, False, type(e).__name__)
        if problems:
            return Fault(FaultKind.INVALID_ARGUMENTS, f"{self.name}: {problems}")
        return dict(arguments)

    async def __call__(self, arguments: Any, *, dry_run: bool = False) -> ToolResult:
        """Validate, dry-run or send, classify. Never raises."""
        t0 = time.perf_counter()
        args = self.validate(arguments)
        if isinstance(args, Fault):
            return ToolResult.failure(args)
        name, sent = self.remote, args
        intended = {"tool": self.remote, "arguments": args, "server": self.box.server.name}
        write = self.effect == "write"
        mode, arg = dry_run_mode(self.dry_run_how)
        if write and dry_run and mode == "refuse":
            call = json.dumps(args, ensure_ascii=False, sort_keys=True)
            return ToolResult(
                content=(
                    f"[dry run] {self.name} was not executed: it changes state outside this "
                    f"episode, and writes are simulated here. Intended call: {self.name}({call})"
                ),
                dry_run=True,
                effect={**intended, "executed": False, "dry_run": "refuse"},
            )
        if write and dry_run and mode == "tool":
            name = str(arg)  # the server's preview
        if write and mode == "argument":
            sent = {**args, str(arg): dry_run}  # hidden from the model: tracerl decides
        sent = {**sent, **self.box.injected(self.remote)}  # the episode's: the model's lose
        try:
            result = await self.box.call(name, sent, self.timeout_s)
        except Exception as e:  # a tool never raises into the runner
            return ToolResult.failure(self._fault(e), (time.perf_counter() - t0) * 1000)
        text, cut = result_text(result, self.box.server.max_result_chars)
        out = ToolResult(
            content=text,
            latency_ms=(time.perf_counter() - t0) * 1000,
            truncated=cut,
            is_error=bool(result.is_error),
        )
        if self.effect == "write":
            executed = not dry_run
            out.dry_run = dry_run
            out.effect = {
                **intended,
                "executed": executed and not result.is_error,
                **({"dry_run": self.dry_run_how} if dry_run else {}),
                **({"preview": text[:2000]} if dry_run else {}),
            }
        return out

    def _fault(self, e: BaseException) -> Fault:
        """An exception from the server or the connection, classified (always the
        environment's: the arguments were checked against the schema first)."""
        kind_of = type(e).__name__
        safe = self.effect == "read" or bool(self.hints.get("idempotentHint"))
        where = f"{self.name} (MCP server {self.box.server.name!r})"
        code = getattr(e, "code", None)
        if isinstance(e, TimeoutError) or code == -32001:  # REQUEST_TIMEOUT
            return Fault(
                FaultKind.TIMEOUT, f"{where} timed out after {self.timeout_s:g} s", safe, kind_of
            )
        if isinstance(e, mc.McpUnavailable):
            # a restarted stdio server would be a different world (its state is gone):
            # only a remote server is worth reaching again
            retry = safe and self.box.server.transport == "http"
            return Fault(FaultKind.SERVER_ERROR, str(e), retry, kind_of)
        if code is not None:  # the server answered with a JSON-RPC error: a protocol fault
            return Fault(
                FaultKind.SERVER_ERROR,
                f"{where} answered with protocol error {code}: {getattr(e, 'message', e)}",
                safe,
                kind_of,
            )
        return Fault(FaultKind.SERVER_ERROR, f"{where}: {mc.describe(e)}", safe, kind_of)


class McpTools:
    """The tools of one MCP server, for an environment (`ToolEnv.use`).

    Building it reads the server's tool list once per process (so an environment knows its
    tools before any episode). `start` (at each episode's reset) connects: with
    ``scope: episode`` a fresh server for the episode, whose listing then versions the
    tools; with ``scope: worker`` the process's shared one. `stop` (at close) ends an
    episode's server.
    """

    def __init__(self, server: McpServer | dict[str, Any] | str | list[str]) -> None:
        mc.import_mcp()
        self.server = as_server(server)
        """As configured (its episode placeholders unfilled): its name and pool key."""
        self.episode: McpServer | None = None
        """The server with this episode's values filled (between `start` and `stop`)."""
        self.episode_dir: str | None = None
        self.conn: mc.Connection | None = None
        self._placeholders = self.server.placeholders()  # once: `start` runs per episode
        folder = tempfile.mkdtemp(prefix="tracerl-listing-")
        try:
            self._listing = pool.listing(self.server, self._for_listing(folder))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        self._tools = self._build(self._listing)
        if self.unannotated() and self._listing.tools and self.server.name not in _WARNED:
            _WARNED.add(self.server.name)  # once per process
            log.warning("%s", unannotated_warning(self.server, len(self._listing.tools)))

    # ---- what the environment sees ---------------------------------------------------------
    def tools(self) -> list[McpTool]:
        return list(self._tools)

    def identity(self) -> dict[str, Any]:
        """For receipts: the server as it identified itself."""
        return dict(self._listing.identity)

    def unannotated(self) -> bool:
        """The server declares no annotations on any tool (and the config overrides none):
        every tool is a write."""
        return not self.server.annotations and not any(t.annotations for t in self._listing.tools)

    # ---- the episode's connection ----------------------------------------------------------
    async def start(self, episode: Any = None) -> None:
        """Connect for an episode (retrying a server that will not start), its placeholders
        filled from `episode` (an `EpisodeContext`: id, seed, task)."""
        await self.stop()
        self.episode = self._for(episode)
        for attempt in range(START_ATTEMPTS):
            try:
                self.conn = await mc.on_hub(self._connect())
                break
            except mc.McpUnavailable:
                if attempt == START_ATTEMPTS - 1:
                    raise
                await asyncio.sleep(0.2 * 2**attempt)
        assert self.conn is not None and self.conn.listing is not None
        if self.conn.listing != self._listing:
            self._listing = self.conn.listing
            self._tools = self._build(self._listing)

    def _for(self, episode: Any) -> McpServer:
        """The server for `episode`: placeholders filled, a fresh ``${episode_dir}``."""
        if not self._placeholders:
            return self.server
        if episode is None:
            episode_id, seed, task = "episode", 0, {}
        else:
            episode_id, seed, task = episode.episode_id, episode.seed, episode.task
        if "${episode_dir}" in self._placeholders:
            self.episode_dir = tempfile.mkdtemp(prefix="tracerl-episode-")
        values = episode_values(episode_id, seed, task, self.episode_dir or "")
        return self.server.for_episode(values)

    def _for_listing(self, folder: str) -> McpServer:
        """The server the tools are listed from, before any episode (in `folder`), every
        task field its settings name empty (`final_state` and `inject` may name fields its
        start does not)."""
        if not self.server.started_with_placeholders():
            return self.server
        used = self._placeholders
        task = {p[len("${task.") : -1]: "" for p in used if p.startswith("${task.")}
        return self.server.for_episode(episode_values(LISTING_EPISODE, 0, task, folder))

    async def _connect(self) -> mc.Connection:
        if self.server.scope == "worker":
            return await pool.shared(self.server)
        return await pool.fresh(self.current)

    async def _disconnect(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None and self.server.scope == "episode":
            await mc.on_hub(conn.close())

    async def stop(self) -> None:
        """End the episode's connection (its server, with ``scope: episode``) and remove its
        ``${episode_dir}``."""
        try:
            await self._disconnect()
        finally:
            folder, self.episode_dir, self.episode = self.episode_dir, None, None
            if folder:
                shutil.rmtree(folder, ignore_errors=True)

    @property
    def current(self) -> McpServer:
        """The server as this episode has it (placeholders filled), else as configured."""
        return self.episode or self.server

    def episode_server(self, episode: Any = None) -> McpServer:
        """The server as one episode starts it (a check's fresh start): this episode's, else
        `episode`'s (an `EpisodeContext`: a real task fills ``${task.<field>}``)."""
        return self.episode or self._for(episode)

    def injected(self, remote: str) -> dict[str, Any]:
        """The arguments tracerl sets on every call of tool `remote` this episode."""
        server = self.current
        return dict(matching(remote, server.inject) or {})

    async def final_state(self) -> dict[str, Any] | None:
        """The server's ``final_state`` calls, made now (the episode has ended, the server
        still runs): ``{key: result text}``. A call that fails or answers with an error
        raises (the reward would decide on nothing: the environment's fault)."""
        server = self.current
        if not server.final_state:
            return None
        out: dict[str, Any] = {}
        for read in server.final_state:
            sent = {**read.arguments, **self.injected(read.tool)}
            where = f"{server.where()}: final_state {read.tool}"
            try:
                result = await self.call(read.tool, sent, server.timeout_s)
            except Exception as e:
                raise RuntimeError(f"{where}: {mc.describe(e)}") from None
            text, _ = result_text(result, server.max_result_chars)
            if result.is_error:
                raise RuntimeError(f"{where}: {text[:300]}")
            out[read.label] = text
        return out

    async def call(self, name: str, arguments: dict[str, Any], timeout: float) -> Any:
        if self.conn is not None and self.conn.dead and self.server.transport == "http":
            await self._disconnect()  # an HTTP server may be back: reconnect (stdio: not)
        if self.conn is None:
            self.conn = await mc.on_hub(self._connect())  # called before start, or reconnect
        conn = self.conn
        return await mc.on_hub(conn.call(name, arguments, timeout), timeout + 10)

    # ---- tools from a listing --------------------------------------------------------------
    def _build(self, listing: mc.Listing) -> list[McpTool]:
        s = self.server
        offered = {t.name: t for t in listing.tools}
        unknown = sorted(set(s.tools or ()) - set(offered))
        if unknown:
            raise ValueError(
                f"{s.where()}: tools {unknown} were asked for (`tools`) but the server has "
                f"only {sorted(offered)}"
            )
        for key in ("annotations", "inject"):
            stray = unmatched(getattr(s, key), offered)
            if stray:
                raise ValueError(
                    f"{s.where()}: `{key}` names {stray}, which match no tool of the server "
                    f"(its tools: {sorted(offered)})"
                )
        names = [n for n in offered if s.tools is None or n in s.tools]
        tools = [self._tool(offered[n], listing, offered) for n in names]
        stray = sorted(set(s.dry_run) - {t.remote for t in tools if t.effect == "write"})
        if stray:
            raise ValueError(
                f"{s.where()}: `dry_run` names {stray}, which are not write tools offered here"
            )
        for read in s.final_state:
            t = offered.get(read.tool)
            hints = t and effective_hints(t.annotations, matching(t.name, s.annotations))
            if not hints or not hints["readOnlyHint"]:
                raise ValueError(
                    f"{s.where()}: final_state calls {read.tool!r}, which "
                    + (
                        "is not annotated read-only: reading the final state must change "
                        f"nothing (annotate it, or set annotations.{read.tool}.readOnlyHint)"
                        if t
                        else f"the server does not offer (its tools: {sorted(offered)})"
                    )
                )
        return tools

    def _tool(self, t: Any, listing: mc.Listing, offered: dict[str, Any]) -> McpTool:
        s = self.server
        hints = effective_hints(t.annotations, matching(t.name, s.annotations))
        effect = "read" if hints["readOnlyHint"] else "write"
        how = s.dry_run.get(t.name, "refuse")
        if effect == "write":
            check_dry_run(s, t, how, offered)
        schema = dict(t.input_schema or {"type": "object", "properties": {}})
        check_schema(s, t.name, schema)
        identity = listing.identity
        declared = t.annotations.model_dump(exclude_none=True) if t.annotations else {}
        digest = schema_hash(
            {"name": t.name, "description": t.description, "schema": schema, "hints": declared}
        )
        if effect == "write" and how.startswith("argument:"):
            schema = without(schema, how.partition(":")[2])
        for arg in matching(t.name, s.inject) or ():
            if arg not in (schema.get("properties") or {}):
                raise ValueError(
                    f"{s.where()}: inject sets {arg!r} on {t.name!r}, whose input schema has "
                    f"no such property (its properties: {sorted(schema.get('properties') or {})})"
                )
            schema = without(schema, arg)  # tracerl's to set, not the model's
        version = f"{identity.get('name') or s.name}@{identity.get('version') or '?'}#{digest}"
        return McpTool(
            name=model_name(s.prefix, t.name),
            description=(t.description or getattr(t, "title", None) or t.name).strip(),
            parameters=schema,
            fn=None,  # type: ignore[arg-type] - the server runs it
            effect=effect,
            timeout_s=s.timeout_s,
            version=version,
            has_dry_run=True,  # every write has one: refuse, a preview tool or an argument
            remote=t.name,
            hints=hints,
            dry_run_how=how,
            box=self,
        )
