"""A third-party-style MCP server for tests: it keeps per-"database" state in files and
declares no tool annotations (as most published servers do not), so the episodes that share
it leak state into each other unless the run's configuration keeps them apart.

    python tests/notes_server.py [--root DIR]

State: ``<root>/<db>.json`` for each database named by a call's ``db`` argument (default
``main``); ``--root`` defaults to one folder in the system's temp directory, shared by every
server started without it (like servers that keep a fixed data folder). Tools:
``write_note(text, db)``, ``read_notes(db)``, ``dump(db)`` (the whole database as JSON)."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from mcp.server.mcpserver import MCPServer


def build(root: Path) -> MCPServer:
    server = MCPServer(name="notes", version="2.1.0")
    root.mkdir(parents=True, exist_ok=True)

    def path(db: str) -> Path:
        if not db.replace("-", "").replace("_", "").replace(":", "").isalnum():
            raise ValueError(f"bad database name {db!r}")
        return root / f"{db.replace(':', '_')}.json"

    def load(db: str) -> list[str]:
        p = path(db)
        return json.loads(p.read_text()) if p.exists() else []

    @server.tool()
    def write_note(text: str, db: str = "main") -> str:
        """Add a note to a database."""
        notes = [*load(db), text]
        tmp = path(db).with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(notes))
        os.replace(tmp, path(db))
        return f"noted ({len(notes)} notes)"

    @server.tool()
    def read_notes(db: str = "main") -> str:
        """The notes of a database, one per line."""
        return "\n".join(load(db)) or "(no notes)"

    @server.tool()
    def dump(db: str = "main") -> str:
        """The whole database, as JSON."""
        return json.dumps({"db": db, "notes": load(db)})

    return server


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--root", default=str(Path(tempfile.gettempdir()) / "notes-server-data"))
    a = p.parse_args()
    build(Path(a.root)).run("stdio")


if __name__ == "__main__":
    main()
