"""Fixtures of the unit tests: the MCP tests' key-value store and its HTTP server."""

from tests.mcp_helpers import http, store  # noqa: F401 - fixtures, found by pytest here
