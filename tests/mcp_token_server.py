"""examples/kv_server.py over streamable HTTP behind a bearer token: every request without
``Authorization: Bearer TOKEN`` is answered 401, and each request's header is appended to a
log file (what the test reads back).

    python tests/mcp_token_server.py --data store.json --port PORT --token T --log seen.txt
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import uvicorn

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "kv_server.py"


def _kv_server():
    spec = importlib.util.spec_from_file_location("kv_server", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def guarded(app, token: str, log: Path):
    """`app`, answering 401 to any HTTP request that does not carry the token."""
    want = f"Bearer {token}".encode()

    async def asgi(scope, receive, send):
        if scope["type"] == "http":
            got = dict(scope["headers"]).get(b"authorization", b"")
            with log.open("a") as f:
                f.write(got.decode(errors="replace") + "\n")
            if got != want:
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b"no token"})
                return
        await app(scope, receive, send)

    return asgi


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--token", required=True)
    p.add_argument("--log", required=True)
    a = p.parse_args()
    server = _kv_server().build(Path(a.data), "1.0.0")
    app = guarded(server.streamable_http_app(), a.token, Path(a.log))
    uvicorn.run(app, host="127.0.0.1", port=a.port, log_level="warning")


if __name__ == "__main__":
    main()
