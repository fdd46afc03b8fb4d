"""The request handler our two small HTTP servers share (`tracerl serve`, `tracerl
serve-retriever`): JSON answers with their length, and no request log."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from typing import Any


class JSONHandler(BaseHTTPRequestHandler):
    def _send(self, status: int, payload: dict[str, Any], *, ascii_only: bool = False) -> None:
        """`ascii_only`: escape every non-ASCII character (text a model wrote may hold
        what UTF-8 cannot encode)."""
        data = json.dumps(payload, ensure_ascii=ascii_only).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:  # quiet: tests and rollouts stay readable
        pass
