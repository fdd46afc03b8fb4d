"""Tools served by MCP servers (the `mcp` SDK, over stdio or streamable HTTP), with their
annotations mapped to tool effects: reads run, writes are budgeted and dry-run.

* `McpServer` — how a server is reached and how its tools are treated (`config`);
* `McpTools` — a server's tools for a `ToolEnv` (``env.use(McpTools(...))``, `tools`);
* `attach` — the servers of a run config's ``env.mcp`` added to any `ToolEnv`;
* the connections live on one background loop per process (`client`), and a stdio server
  never outlives the process that started it (`tracerl.engines.guard`).

See docs/mcp.md.
"""

from __future__ import annotations

from typing import Any

from tracerl.envs.mcp.config import McpServer, ToolHints
from tracerl.envs.mcp.tools import McpTool, McpTools


def attach(env: Any, servers: list[Any], cwd: str | None = None) -> Any:
    """`env` offering the tools of `servers` (a config's ``env.mcp``) besides its own.

    The env must be a `ToolEnv` (its `step` runs tool calls by name); the servers are
    recorded in ``env.spec["mcp"]`` so a live replay or a Ray worker rebuilds the same. A
    stdio server without a ``cwd`` runs in `cwd` (the driver's directory: a relative
    command means the same on every worker)."""
    from tracerl.envs.base import ToolEnv
    from tracerl.envs.faults import FaultInjector
    from tracerl.errors import UserError

    if not servers:
        return env
    target = env.env if isinstance(env, FaultInjector) else env
    if not isinstance(target, ToolEnv):
        raise UserError(
            f"env.mcp: environment {env.name!r} is a {type(env).__name__}, not a ToolEnv: "
            "only a ToolEnv runs tool calls by name",
            "base the environment on tracerl.envs.ToolEnv, or call the server from its own "
            "step() (tracerl.envs.mcp.McpTools)",
        )
    configs = [McpServer.model_validate(s) if isinstance(s, dict) else s for s in servers]
    spec = getattr(env, "spec", None)
    if isinstance(spec, dict):  # as given: a replay elsewhere resolves cwd there
        given = [s.model_dump(mode="json", exclude_defaults=True) for s in configs]
        spec["mcp"] = [*spec.get("mcp", []), *given]
    for server in configs:
        if cwd and server.command is not None and server.cwd is None:
            server = server.model_copy(update={"cwd": cwd})
        target.use(McpTools(server))
    return env


__all__ = ["McpServer", "McpTool", "McpTools", "ToolHints", "attach"]
