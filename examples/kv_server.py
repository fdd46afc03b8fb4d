"""A small key-value store served over MCP with the `mcp` SDK: the example's tool server
(examples/kv_lookup.yaml), and the one tracerl's tests start.

    python examples/kv_server.py [--data store.json] [--version 1.0.0]   # stdio
    python examples/kv_server.py --data store.json --http PORT           # streamable HTTP

Its data is the JSON object in ``--data`` (created with the demo data if missing); writes go
to that file, so a test sees from outside whether a write really happened. Without
``--data`` it serves the demo data from memory: 50 keys ``k0``..``k49``, each a digit.

Tools: ``get`` (read-only), ``put`` (writes, not destructive, idempotent), ``delete``
(destructive), ``delete_preview`` (read-only: what a delete would do), ``rename`` (takes its
own ``dry_run`` flag), and for failure tests ``slow`` (sleeps), ``big`` (a long result) and
``broken`` (answers with ``isError``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

READ = ToolAnnotations(read_only_hint=True, open_world_hint=False)


def demo_data() -> dict[str, str]:
    """50 keys, each holding a digit (the example's tasks read them)."""
    rng = random.Random("kv-store-demo")
    return {f"k{i}": str(rng.randrange(10)) for i in range(50)}


def build(data: Path | None, version: str) -> MCPServer:
    server = MCPServer(name="kv-store", version=version)
    memory = demo_data()

    def load() -> dict[str, str]:
        if data is None:
            return dict(memory)
        if not data.exists():
            save(demo_data())
        return json.loads(data.read_text())

    def save(store: dict[str, str]) -> None:
        if data is None:
            memory.clear()
            memory.update(store)
            return
        tmp = data.with_suffix(".tmp")
        tmp.write_text(json.dumps(store, sort_keys=True))
        os.replace(tmp, data)

    @server.tool(annotations=READ)
    def get(key: str) -> str:
        """Read the value stored under a key."""
        store = load()
        if key not in store:
            raise ToolError(f"no value under {key!r}")
        return store[key]

    @server.tool(
        annotations=ToolAnnotations(
            read_only_hint=False, destructive_hint=False, idempotent_hint=True
        )
    )
    def put(key: str, value: str) -> str:
        """Store a value under a key."""
        store = load()
        store[key] = value
        save(store)
        return f"stored {key}"

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True))
    def delete(key: str) -> str:
        """Delete a key and its value."""
        store = load()
        if store.pop(key, None) is None:
            raise ToolError(f"no value under {key!r}")
        save(store)
        return f"deleted {key}"

    @server.tool(annotations=READ)
    def delete_preview(key: str) -> str:
        """What deleting a key would do, without doing it."""
        store = load()
        return f"would delete {key}" if key in store else f"nothing under {key!r}"

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True))
    def rename(key: str, new_key: str, dry_run: bool = False) -> str:
        """Move a value to a new key (dry_run: say what would happen, change nothing)."""
        store = load()
        if key not in store:
            raise ToolError(f"no value under {key!r}")
        if not dry_run:
            store[new_key] = store.pop(key)
            save(store)
        return f"{'would rename' if dry_run else 'renamed'} {key} to {new_key}"

    @server.tool(annotations=READ)
    def slow(seconds: float) -> str:
        """Sleep, then answer."""
        time.sleep(seconds)
        return "done"

    @server.tool(annotations=READ)
    def big(chars: int) -> str:
        """A long answer."""
        return "x" * chars

    @server.tool(annotations=READ)
    def broken() -> str:
        """Always fails."""
        raise ToolError("the tool failed on purpose")

    return server


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data")
    p.add_argument("--version", default="1.0.0")
    p.add_argument("--pidfile")
    p.add_argument("--http", type=int)
    a = p.parse_args()
    if a.pidfile:
        Path(a.pidfile).write_text(str(os.getpid()))
    server = build(Path(a.data) if a.data else None, a.version)
    if a.http:
        server.run("streamable-http", host="127.0.0.1", port=a.http)
    else:
        server.run("stdio")


if __name__ == "__main__":
    main()
