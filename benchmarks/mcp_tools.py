"""What a tool costs when an MCP server serves it, against the same tool in-process.

Run: .venv/bin/python benchmarks/mcp_tools.py [--calls 200] [--episodes 8]

The tool is examples/kv_server.py's ``get`` (read a key from a JSON file); the baseline is
the same function as a native tracerl tool (`@tool`), measured in the same run. Sides:

  native            the function as an in-process tool;
  mcp stdio         the server over stdio (tracerl starts it), one worker connection;
  mcp http          the server over streamable HTTP (started here), one connection;
  start: episode    an episode's connect with ``scope: episode`` (a new stdio server: start,
                    handshake, listing), what every episode pays in that scope;
  start: worker     the same with ``scope: worker`` (the process's connection, reused).

Prints the median and p90 per call in ms and the ratios to native; then the start costs,
and how many concurrent episodes' starts take how long (--episodes at once).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tracerl.envs.mcp import McpServer, McpTools
from tracerl.envs.tools import tool

SERVER = str(Path(__file__).resolve().parents[1] / "examples" / "kv_server.py")


def native_tool(store: Path):
    @tool(effect="read", version="1")
    def get(key: str) -> str:
        """Read the value stored under a key.

        Args:
            key: the key.
        """
        return json.loads(store.read_text())[key]

    return get


async def per_call(t, n: int) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        r = await t({"key": f"k{i % 50}"})
        assert r.error is None, r.content
        out.append((time.perf_counter() - t0) * 1000)
    return out


def stats(ms: list[float]) -> tuple[float, float]:
    ms = sorted(ms)
    return statistics.median(ms), ms[int(0.9 * (len(ms) - 1))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def main(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp())
    store = tmp / "store.json"
    store.write_text(json.dumps({f"k{i}": str(i % 10) for i in range(50)}))
    port = free_port()
    http = subprocess.Popen(
        [sys.executable, SERVER, "--data", str(store), "--http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        stdio = McpServer(name="kv", command=["python", SERVER, "--data", str(store)])
        box_stdio = McpTools(stdio.model_copy(update={"scope": "worker"}))
        deadline = time.monotonic() + 30
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            if time.monotonic() > deadline:
                raise RuntimeError("the HTTP server did not start")
            time.sleep(0.1)
        box_http = McpTools(McpServer(name="kv", url=f"http://127.0.0.1:{port}/mcp"))
        await box_stdio.start()
        await box_http.start()
        sides = {
            "native": native_tool(store),
            "mcp stdio": {t.name: t for t in box_stdio.tools()}["get"],
            "mcp http": {t.name: t for t in box_http.tools()}["get"],
        }
        for t in sides.values():
            await per_call(t, 10)  # warm-up
        base = None
        print(f"per call, {args.calls} calls (ms): median, p90, median vs native")
        for name, t in sides.items():
            med, p90 = stats(await per_call(t, args.calls))
            base = base or med
            print(f"  {name:<11} {med:8.3f} {p90:8.3f} {med / base:8.1f}x")
        await box_http.stop()

        async def start(box: McpTools) -> float:
            t0 = time.perf_counter()
            await box.start()
            await box.stop()
            return (time.perf_counter() - t0) * 1000

        episode = McpTools(stdio)
        ep = [await start(episode) for _ in range(3)]
        wk = [await start(box_stdio) for _ in range(3)]
        print("connect per episode (ms, median of 3):")
        print(f"  scope: episode {statistics.median(ep):8.0f}   (a new stdio server)")
        print(f"  scope: worker  {statistics.median(wk):8.1f}   (reused)")
        boxes = [McpTools(stdio) for _ in range(args.episodes)]
        t0 = time.perf_counter()
        await asyncio.gather(*(b.start() for b in boxes))
        took = time.perf_counter() - t0
        await asyncio.gather(*(b.stop() for b in boxes))
        print(f"  {args.episodes} episodes starting at once (scope: episode): {took:.2f} s")
    finally:
        http.kill()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--episodes", type=int, default=8)
    asyncio.run(main(p.parse_args()))
