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


def attach(env: Any, servers: list[Any]) -> Any:
    """`env` offering the tools of `servers` (a config's ``env.mcp``) besides its own.

    The env must be a `ToolEnv` (its `step` runs tool calls by name); the servers are
    recorded in ``env.spec["mcp"]`` so a live replay or a Ray worker rebuilds the same."""
    from tracerl.envs.base import ToolEnv
    from tracerl.errors import UserError

    if not servers:
        return env
    target = getattr(env, "env", env)  # a wrapper (FaultInjector): the env it wraps
    if not isinstance(target, ToolEnv):
        raise UserError(
            f"env.mcp: environment {env.name!r} is a {type(env).__name__}, not a ToolEnv: "
            "only a ToolEnv runs tool calls by name",
            "base the environment on tracerl.envs.ToolEnv, or call the server from its own "
            "step() (tracerl.envs.mcp.McpTools)",
        )
    configs = [McpServer.model_validate(s) if isinstance(s, dict) else s for s in servers]
    for server in configs:
        target.use(McpTools(server))
    spec = getattr(env, "spec", None)
    if isinstance(spec, dict):
        spec["mcp"] = [s.model_dump(mode="json", exclude_defaults=True) for s in configs]
    return env


__all__ = ["McpServer", "McpTool", "McpTools", "ToolHints", "attach"]
