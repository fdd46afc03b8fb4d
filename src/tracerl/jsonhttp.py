"""What our small HTTP servers share (`tracerl serve`, the gateway, `tracerl
serve-retriever`): JSON answers with their length, no request log, and no traceback when a
client went away before its answer was written (`Server`)."""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Server(ThreadingHTTPServer):
    """A threading HTTP server for which a client that hung up (a broken pipe, a reset
    connection: an agent cancelled, a test's client closed) is not an error: nothing is
    printed. Any other exception in a handler is still printed with its traceback."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):  # BrokenPipe, ConnectionReset...
            return
        super().handle_error(request, client_address)


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
