"""An HTTP MCP server's ``headers`` (a bearer token from an environment variable) reach the
server on every request, through the MCP SDK's HTTP client, and never reach a receipt; a
server that refuses the request is the environment's failure, not the policy's."""

from __future__ import annotations

import gzip
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.mcp_helpers import ENV, _free_port, calls, play, tool_calls
from tracerl.envs.registry import make_with

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "s3cret-kv-token"


@pytest.fixture
def guarded(store, tmp_path):
    """examples/kv_server.py over HTTP behind TOKEN (tests/mcp_token_server.py): its URL and
    the file of the Authorization headers it saw."""
    port, log = _free_port(), tmp_path / "seen.txt"
    cmd = [sys.executable, str(ROOT / "tests" / "mcp_token_server.py"), "--data", str(store)]
    cmd += ["--port", str(port), "--token", TOKEN, "--log", str(log)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert proc.poll() is None and time.monotonic() < deadline, "no token server"
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp", log
    finally:
        proc.kill()
        proc.wait()


def test_the_headers_reach_the_server_with_their_variables_expanded(
    guarded, tiny, monkeypatch, tmp_path
):
    url, log = guarded
    monkeypatch.setenv("KV_TOKEN", TOKEN)
    server = {"name": "kv", "url": url, "headers": {"Authorization": "Bearer ${KV_TOKEN}"}}
    env = make_with(ENV, {}, [server])
    episode = play(
        env, tiny.renderer, [calls(("get", {"key": "color"})), "blue"], out=tmp_path / "run"
    )
    (get,) = tool_calls(episode)
    assert get["result"]["content"] == "blue"
    seen = [line for line in log.read_text().splitlines()]
    assert seen and set(seen) == {f"Bearer {TOKEN}"}  # every request, the variable expanded
    files = [p for p in (tmp_path / "run").rglob("*") if p.is_file()]
    written = b"".join(
        gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes() for p in files
    )
    assert b"blue" in written  # the episode is there, in what was read
    assert TOKEN.encode() not in written and TOKEN not in json.dumps(
        episode.receipt.env, default=str
    )


def test_a_server_that_refuses_the_request_is_the_environments_failure(guarded, tiny, monkeypatch):
    url, log = guarded
    monkeypatch.setenv("KV_TOKEN", TOKEN)
    server = {"name": "kv", "url": url, "headers": {"Authorization": "Bearer ${KV_TOKEN}"}}
    env = make_with(ENV, {}, [server])
    box = env.toolboxes[0]
    box.server = box.server.model_copy(update={"headers": {}})  # the token is gone
    episode = play(env, tiny.renderer, [calls(("get", {"key": "color"})), "blue"])
    assert episode.stop_reason.value == "infra_failure"
    assert episode.attribution.value == "environment"
    assert "could not be reached" in episode.receipt.error
    assert "" in log.read_text().splitlines()  # it was asked, without a token
