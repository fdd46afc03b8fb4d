"""MCP test helpers: the example's key-value server over stdio or HTTP, a scripted
policy, and one episode played through the runner."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tracerl.envs import get_parser
from tracerl.rollout import ScriptedSampler
from tracerl.rollout.budget import Budgets, RolloutConfig
from tracerl.rollout.persist import EpisodeWriter
from tracerl.rollout.runner import Policy, run_episode

SERVER = "examples/kv_server.py"
ENV = "tests.mcp_env:KvTasks"
P = get_parser("json_list")


def calls(*pairs):
    return P.format_calls(list(pairs))


@pytest.fixture
def store(tmp_path):
    path = tmp_path / "store.json"
    path.write_text(json.dumps({"color": "blue", "size": "large"}))
    return path


def stdio(store, **extra):
    return {"name": "kv", "command": ["python", SERVER, "--data", str(store)], **extra}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HttpServer:
    """examples/kv_server.py over streamable HTTP, started (and restarted) by the test."""

    def __init__(self, store: Path) -> None:
        self.store, self.port, self.proc = store, _free_port(), None
        self.url = f"http://127.0.0.1:{self.port}/mcp"

    def start(self, version: str = "1.0.0") -> None:
        cmd = [sys.executable, SERVER, "--data", str(self.store), "--http", str(self.port)]
        self.proc = subprocess.Popen(
            [*cmd, "--version", version], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.1)
        raise RuntimeError("the HTTP MCP server did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


@pytest.fixture
def http(store):
    server = HttpServer(store)
    server.start()
    yield server
    server.stop()


def policy(renderer, texts, on_turn=None):
    def turn(req):
        if on_turn is not None:
            on_turn(req.turn)
        return texts[min(req.turn, len(texts) - 1)]

    return Policy(ScriptedSampler.from_texts(renderer, turn), renderer, P, "tiny-random")


def play(env, renderer, texts, *, budgets=None, on_turn=None, out=None):
    task = env.sample_tasks(1)[0]
    cfg = RolloutConfig(budgets=budgets or Budgets(write_actions=2), reserve=None)
    episode = asyncio.run(
        run_episode(env, task, policy(renderer, texts, on_turn), cfg, seed=0, episode_id="e:s0")
    )
    if out is not None:
        EpisodeWriter(out).append(episode.trajectories)
    return episode


def tool_calls(episode):
    return [c for s in episode.steps for c in s.get("calls", [])]
