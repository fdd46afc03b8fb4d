"""What `check_env` adds for tools from MCP servers.

* servers — each server identifies itself (name and version: what versions its tools in
  receipts), and two fresh starts of it list the same tools at the same versions (a
  server whose listing changes from one start to the next cannot be replayed against);
* dry runs — every MCP write tool the env's own `check_script` does not exercise is called
  once under the guard with arguments made from its schema: it must come back as a dry run
  with its intended effect, never executed.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

from tracerl.envs.mcp import client as mc
from tracerl.envs.mcp import pool
from tracerl.envs.mcp.schema import unannotated_warning
from tracerl.envs.mcp.tools import McpTool


def mcp_tools(env: Any) -> list[McpTool]:
    return [t for t in env.tools if isinstance(t, McpTool)]


async def check_servers(factory: Callable[[], Any], seed: int) -> str:
    """A problem, or ``"note: "`` and what the servers are. Each server is started (or
    connected to) twice afresh, whatever its scope, as an episode of a task of the env's
    would start it (its fields fill ``${task.<field>}``), each start an episode id of its
    own: the two listings must agree."""
    from tracerl.envs.base import EpisodeContext

    env = factory()
    task = env.sample_tasks(1, seed=seed)[0]
    parts, warnings = [], []
    for box in env.toolboxes:
        server = box.server
        if box.unannotated():
            warnings.append(unannotated_warning(server, len(box.tools())))
        listings = []
        try:
            for _ in range(2):
                episode = EpisodeContext(f"check-env:servers:{uuid.uuid4().hex[:12]}", seed, task)
                conn = await mc.on_hub(pool.fresh(box.episode_server(episode)))
                await mc.on_hub(conn.close())
                listings.append(conn.listing)
                await box.stop()  # its ${episode_dir}, if it has one
        finally:
            await box.stop()
        first, second = ({t.name: _tool_key(t) for t in li.tools} for li in listings)
        if first != second or listings[0].identity != listings[1].identity:
            changed = sorted(k for k in {*first, *second} if first.get(k) != second.get(k))
            return (
                f"MCP server {server.name!r}: two fresh starts listed different tools or "
                f"versions ({changed or 'its identity'}): its episodes cannot be replayed "
                "against one listing"
            )
        s = listings[0].identity
        if not s.get("name") or not s.get("version"):
            return (
                f"MCP server {s['server']!r} reports no name or version: receipts could not "
                "tell its releases apart (set them in the server's constructor)"
            )
        parts.append(f"{s['server']} = {s['name']}@{s['version']} ({s['transport']})")
    note = "note: " + "; ".join(parts)
    return "warning: " + "; ".join(warnings) + "; " + note if warnings else note


def _tool_key(t: Any) -> str:
    return json.dumps(t.model_dump(mode="json", exclude_none=True), sort_keys=True)


def example_arguments(schema: dict[str, Any]) -> dict[str, Any]:
    """Arguments that fit `schema`'s required properties (a probe of the dry-run path)."""
    out: dict[str, Any] = {}
    props = schema.get("properties") or {}
    for name in schema.get("required") or []:
        out[name] = _example(props.get(name) or {})
    return out


def _example(p: dict[str, Any]) -> Any:
    if p.get("enum"):
        return p["enum"][0]
    if "const" in p:
        return p["const"]
    if "default" in p:
        return p["default"]
    for key in ("anyOf", "oneOf"):
        if p.get(key):
            return _example(p[key][0])
    kind = p.get("type")
    kind = kind[0] if isinstance(kind, list) and kind else kind
    return {
        "string": "check-env",
        "integer": p.get("minimum", 0),
        "number": p.get("minimum", 0),
        "boolean": False,
        "array": [],
        "object": example_arguments(p),
        "null": None,
    }.get(kind, "check-env")


async def probe_dry_runs(env: Any, names: list[str]) -> tuple[set[str], str | None]:
    """Call each MCP write tool of `names` once, guarded: (those that ran dry, a problem)."""
    ran: set[str] = set()
    for t in mcp_tools(env):
        if t.name not in names or t.effect != "write":
            continue
        result = await t(example_arguments(t.parameters), dry_run=True)
        if result.error is not None and result.error.kind.value == "invalid_arguments":
            return ran, (
                f"{t.name}: could not make arguments its schema accepts "
                f"({result.error.message}); call it in the env's check_script"
            )
        if result.error is not None:
            return ran, f"{t.name}: its dry run ({t.dry_run_how}) failed: {result.error.message}"
        if not result.dry_run or not result.effect or result.effect.get("executed"):
            return ran, f"{t.name}: a guarded call did not come back as a dry run"
        ran.add(t.name)
    return ran, None
