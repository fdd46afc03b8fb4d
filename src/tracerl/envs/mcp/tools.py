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
call the schema refuses is the policy's ``invalid_arguments``). A result with ``isError``
is an ordinary observation. A server that will not start, dies, times out or answers with a
protocol error is the environment's fault, retried when a retry is safe (reads, and writes
the server marks idempotent). A tool's version is ``<server>@<server version>#<schema
hash>``: a server upgrade or a changed schema shows in receipts and live replays.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from tracerl.envs.mcp import client as mc
from tracerl.envs.mcp import pool
from tracerl.envs.mcp.config import McpServer, ToolHints, as_server, dry_run_mode
from tracerl.envs.tools import Tool, ToolResult
from tracerl.types import Fault, FaultKind

START_ATTEMPTS = 3
"""Tries to start (connect to) a server at an episode's start before it is an infra failure."""


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
            },
        }

    def validate(self, arguments: Any) -> dict[str, Any] | Fault:
        if not isinstance(arguments, dict):
            return Fault(FaultKind.INVALID_ARGUMENTS, f"{self.name}: arguments must be an object")
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
        self.conn: mc.Connection | None = None
        self._listing = pool.listing(self.server)
        self._tools = self._build(self._listing)

    # ---- what the environment sees ---------------------------------------------------------
    def tools(self) -> list[McpTool]:
        return list(self._tools)

    def identity(self) -> dict[str, Any]:
        """For receipts: the server as it identified itself."""
        return dict(self._listing.identity)

    # ---- the episode's connection ----------------------------------------------------------
    async def start(self) -> None:
        """Connect for an episode (retrying a server that will not start)."""
        await self.stop()
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

    async def _connect(self) -> mc.Connection:
        if self.server.scope == "worker":
            return await pool.shared(self.server)
        return await pool.fresh(self.server)

    async def stop(self) -> None:
        """End the episode's connection (its server, with ``scope: episode``)."""
        conn, self.conn = self.conn, None
        if conn is not None and self.server.scope == "episode":
            await mc.on_hub(conn.close())

    async def call(self, name: str, arguments: dict[str, Any], timeout: float) -> Any:
        if self.conn is not None and self.conn.dead and self.server.transport == "http":
            await self.stop()  # an HTTP server may be back: reconnect (a stdio one is not)
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
        unannotated = sorted(set(s.annotations) - set(offered))
        if unannotated:
            raise ValueError(
                f"{s.where()}: `annotations` names {unannotated}, which the server does not "
                f"offer (its tools: {sorted(offered)})"
            )
        names = [n for n in offered if s.tools is None or n in s.tools]
        tools = [self._tool(offered[n], listing, offered) for n in names]
        stray = sorted(set(s.dry_run) - {t.remote for t in tools if t.effect == "write"})
        if stray:
            raise ValueError(
                f"{s.where()}: `dry_run` names {stray}, which are not write tools offered here"
            )
        return tools

    def _tool(self, t: Any, listing: mc.Listing, offered: dict[str, Any]) -> McpTool:
        s = self.server
        hints = effective_hints(t.annotations, s.annotations.get(t.name))
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
            schema = _without(schema, how.partition(":")[2])
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


def effective_hints(server: Any, override: ToolHints | None) -> dict[str, Any]:
    """The annotations in force: the config's, else the server's, else the spec's defaults
    (a tool that says nothing may write, destroy, not be retried, reach the world)."""
    defaults = {
        "readOnlyHint": False,
        "destructiveHint": True,
        "idempotentHint": False,
        "openWorldHint": True,
    }
    attrs = {
        "readOnlyHint": "read_only_hint",
        "destructiveHint": "destructive_hint",
        "idempotentHint": "idempotent_hint",
        "openWorldHint": "open_world_hint",
    }
    out = {}
    for key, attr in attrs.items():
        mine = getattr(override, attr, None) if override is not None else None
        theirs = getattr(server, attr, None) if server is not None else None
        out[key] = mine if mine is not None else theirs if theirs is not None else defaults[key]
    if out["readOnlyHint"]:
        out["destructiveHint"] = False  # meaningful only for a tool that writes
    return out


def check_dry_run(s: McpServer, t: Any, how: str, offered: dict[str, Any]) -> None:
    """A declared dry-run path must exist on the server as declared."""
    mode, arg = dry_run_mode(how, where=f"{s.where()}: dry_run.{t.name}")
    if mode == "tool" and arg not in offered:
        raise ValueError(
            f"{s.where()}: dry_run.{t.name} is 'tool:{arg}', but the server has no tool "
            f"{arg!r} (its tools: {sorted(offered)})"
        )
    preview = offered.get(arg)
    if (
        mode == "tool"
        and not effective_hints(preview.annotations, s.annotations.get(arg))["readOnlyHint"]
    ):
        raise ValueError(
            f"{s.where()}: dry_run.{t.name} is 'tool:{arg}', but {arg!r} is not annotated "
            "read-only: a preview must not change anything (annotate it, or override "
            f"annotations.{arg}.readOnlyHint if the server is wrong)"
        )
    if mode == "argument":
        prop = ((t.input_schema or {}).get("properties") or {}).get(arg)
        if not isinstance(prop, dict) or prop.get("type") != "boolean":
            raise ValueError(
                f"{s.where()}: dry_run.{t.name} is 'argument:{arg}', but the tool's schema "
                f"declares no boolean argument {arg!r}"
            )


def model_name(prefix: str, remote: str) -> str:
    """The name the model sees: the prefix and the server's name, with characters tracerl's
    tool names do not allow (MCP allows ``-`` and ``.``) as ``_``, at most 64."""
    return re.sub(r"[^A-Za-z0-9_]", "_", prefix + remote)[:64]


def check_schema(s: McpServer, name: str, schema: dict[str, Any]) -> None:
    """The tool's input schema is JSON Schema the validator can apply, or the server entry
    is refused naming the tool."""
    import jsonschema

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as e:
        raise ValueError(
            f"{s.where()}: tool {name!r} has an input schema that is not valid JSON Schema "
            f"({e.message}); leave it out with `tools`"
        ) from None


def _without(schema: dict[str, Any], name: str) -> dict[str, Any]:
    """`schema` without the property `name` (a dry-run flag the model must not set)."""
    props = {k: v for k, v in (schema.get("properties") or {}).items() if k != name}
    out = {**schema, "properties": props}
    if "required" in schema:
        out["required"] = [r for r in schema["required"] if r != name]
    return out


def schema_hash(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def schema_problems(schema: dict[str, Any], arguments: dict[str, Any]) -> str | None:
    """What the tool's JSON schema says is wrong with `arguments` (None: nothing)."""
    import jsonschema

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    errors = sorted(cls(schema).iter_errors(arguments), key=lambda e: list(e.absolute_path))
    if not errors:
        return None
    return "; ".join(
        f"{'.'.join(str(p) for p in e.absolute_path) or 'arguments'}: {e.message}"
        for e in errors[:3]
    )


def result_text(result: Any, limit: int) -> tuple[str, bool]:
    """A tool result as the observation's text (and whether it was cut at `limit`):
    text parts as they are, other content named, structured content as JSON when that is
    all there is."""
    parts = []
    for c in result.content or ():
        kind = getattr(c, "type", None)
        if kind == "text":
            parts.append(c.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind}: {c.mime_type}, {len(c.data) * 3 // 4} bytes]")
        elif kind == "resource_link":
            parts.append(f"[resource: {c.uri}]")
        elif kind == "resource":
            res = c.resource
            text = getattr(res, "text", None)
            parts.append(text if text is not None else f"[resource: {res.uri}]")
        else:
            parts.append(f"[{kind} content]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False, sort_keys=True))
    text = "\n".join(parts)
    if len(text) <= limit:
        return text, False
    marker = f"\n[... MCP result truncated: showing {limit} of {len(text)} characters ...]"
    return text[:limit] + marker, True
