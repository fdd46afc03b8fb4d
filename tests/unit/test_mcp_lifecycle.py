"""No MCP server outlives its episode, its worker or the run: closed with the episode,
ended at exit, and taken down with a trainer killed by ``kill -9`` (even mid-call)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tracerl.engines.guard import processes

pytest.importorskip("mcp")

TRAINER = textwrap.dedent(
    """
    import asyncio, json, sys, time
    from tracerl.envs.registry import make_with

    tmp = sys.argv[1]
    def server(name, scope):
        return {"name": name, "scope": scope, "prefix": name + "_", "command": [
            "python", "examples/kv_server.py", "--data", f"{tmp}/store.json",
            "--pidfile", f"{tmp}/{name}.pid"]}

    env = make_with("tests.mcp_env:KvTasks", {}, [server("ep", "episode"), server("wk", "worker")])

    async def main():
        await env.reset(env.sample_tasks(1)[0], 0)  # the episode's server starts here
        if sys.argv[2] == "busy":  # the trainer dies while a call is running
            asyncio.ensure_future(env.tools["ep_slow"]({"seconds": 60}))
            await asyncio.sleep(1.0)
            print("ready", flush=True)
            await asyncio.sleep(600)
        await env.close()
        print("closed", flush=True)

    asyncio.run(main())
    print("exiting", flush=True)
    """
)


def _alive(pid: int) -> bool:
    return any(p == pid and state != "Z" for p, _, _, state in processes())


def _gone(pids: list[int], timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.2)
    return False


def _trainer(tmp_path: Path, mode: str) -> subprocess.Popen:
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    (tmp_path / "tmp").mkdir()
    return subprocess.Popen(
        [sys.executable, str(script), str(tmp_path), mode],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        env={
            **os.environ,
            "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
            "TMPDIR": str(tmp_path / "tmp"),  # what the trainer's side leaves behind
        },
    )


def _left_in_tmp(tmp_path: Path, timeout: float = 10.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while any((tmp_path / "tmp").iterdir()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return sorted(p.name for p in (tmp_path / "tmp").iterdir())


def _pids(tmp_path: Path) -> dict[str, int]:
    return {n: int((tmp_path / f"{n}.pid").read_text()) for n in ("ep", "wk")}


def test_servers_end_with_their_episode_and_at_exit(tmp_path):
    proc = _trainer(tmp_path, "close")
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "closed"
    pids = _pids(tmp_path)
    assert _gone([pids["ep"]]), "the episode's server outlived the episode"
    assert _alive(pids["wk"])  # the worker's lives on for the next episode...
    assert proc.wait(timeout=60) == 0
    assert _gone([pids["wk"]]), "the worker's server outlived the process"  # ...until exit
    assert _left_in_tmp(tmp_path) == []


def test_kill_9_of_the_trainer_mid_call_takes_every_server_with_it(tmp_path):
    proc = _trainer(tmp_path, "busy")
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    pids = _pids(tmp_path)
    assert all(_alive(p) for p in pids.values())
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert _gone(list(pids.values())), "an MCP server outlived a trainer killed with kill -9"
    assert _left_in_tmp(tmp_path) == [], "the servers' pid files outlived them"
