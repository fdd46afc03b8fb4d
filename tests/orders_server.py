"""A tau2-bench-style MCP server for tests: one server shared by the episodes of a run
(``scope: worker``), a world of orders per ``state_key`` argument (an episode's, injected by
tracerl), and strict input schemas: ``additionalProperties: false``, so a call with an
argument a tool does not declare is refused, as strict published servers do. It declares
no annotations.

    python tests/orders_server.py

Tools, each taking ``state_key``: ``load_orders(orders)`` (what the environment calls at
reset to set up the episode's world, like tau2's initialization actions: it adds to what
the key holds), ``list_orders()`` (the key and its orders, as JSON), ``get_order(order_id)``
(its status) and ``cancel_order(order_id)``."""

from __future__ import annotations

import json

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError


def build() -> MCPServer:
    server = MCPServer(name="orders", version="0.3.0")
    worlds: dict[str, list[dict[str, str]]] = {}

    def find(state_key: str, order_id: str) -> dict[str, str]:
        for order in worlds.get(state_key, []):
            if order["id"] == order_id:
                return order
        raise ToolError(f"no order {order_id!r}")

    @server.tool()
    def load_orders(orders: list[dict[str, str]], state_key: str) -> str:
        """Add orders to a world."""
        world = worlds.setdefault(state_key, [])
        world.extend(dict(o) for o in orders)
        return f"loaded {len(orders)} orders ({len(world)} in the world)"

    @server.tool()
    def list_orders(state_key: str) -> str:
        """Every order of the world, as JSON."""
        return json.dumps({"state_key": state_key, "orders": worlds.get(state_key, [])})

    @server.tool()
    def get_order(order_id: str, state_key: str) -> str:
        """An order's status."""
        return find(state_key, order_id)["status"]

    @server.tool()
    def cancel_order(order_id: str, state_key: str) -> str:
        """Cancel a pending order."""
        order = find(state_key, order_id)
        order["status"] = "cancelled"
        return f"cancelled {order_id}"

    for tool in server._tool_manager.list_tools():  # strict: no argument it does not declare
        tool.parameters["additionalProperties"] = False
    return server


if __name__ == "__main__":
    build().run("stdio")
