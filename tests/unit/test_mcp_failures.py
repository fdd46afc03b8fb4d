"""A real MCP server failing, over stdio and streamable HTTP: error results, bad
arguments, timeouts, huge results, a server killed mid-episode or that will not start, and
whose fault each is; receipts, exact and live replay; a worker's shared server."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import pytest

from tests.mcp_helpers import (
    ENV,
    calls,
    play,
    stdio,
    tool_calls,
)
from tracerl.envs.registry import make_with
from tracerl.rollout.budget import Budgets
from tracerl.rollout.live_replay import replay_live
from tracerl.rollout.persist import read_run_trajectories
from tracerl.rollout.replay import replay_exact

pytest.importorskip("mcp")


# ---- failures and whose they are --------------------------------------------------------------
def test_error_results_bad_arguments_timeouts_and_huge_results(store, tiny):
    env = make_with(ENV, {}, [stdio(store, timeout_s=1.0, max_result_chars=1000)])
    texts = [
        calls(("broken", {})),
        calls(("get", {"kee": "color"})),
        calls(("big", {"chars": 5000})),
        calls(("slow", {"seconds": 5})),
        "done",
    ]
    budgets = Budgets(steps=8, tool_calls=8)
    cfg_episode = play(env, tiny.renderer, texts, budgets=budgets)
    broken, bad, big, slow = tool_calls(cfg_episode)  # the step that gave up has its call
    attempts = cfg_episode.steps[3]["attempts"]
    assert slow == attempts[-1]["calls"][0]  # the last attempt's, with its fault
    # isError: an ordinary observation, nobody's fault
    assert broken["result"]["is_error"] and broken["result"]["error"] is None
    assert "failed on purpose" in broken["result"]["content"] and not broken["policy_error"]
    assert broken["observation"]["status"] == "tool_error"
    # arguments the schema refuses: the policy's, never sent
    assert bad["result"]["error"]["kind"] == "invalid_arguments" and bad["policy_error"]
    # a huge result: cut with a marker
    assert big["result"]["truncated"] and "MCP result truncated" in big["result"]["content"]
    # a timeout: the environment's, retried (a read), then the episode is not the policy's
    assert slow["result"]["error"]["kind"] == "timeout" and slow["infra_error"]
    assert len(attempts) == 3  # a read that timed out is retried (twice, by default)
    # the receipt names the fault, not only the retries
    assert "tool 'slow': timeout" in cfg_episode.receipt.error
    assert "after 3 attempts" in cfg_episode.receipt.error
    assert cfg_episode.stop_reason.value == "infra_failure"
    assert cfg_episode.attribution.value == "environment" and not cfg_episode.gradient_eligible


def test_a_server_killed_mid_episode_is_the_environments_failure(store, tmp_path, tiny):
    pidfile = tmp_path / "server.pid"
    server = stdio(store)
    server["command"] = [*server["command"], "--pidfile", str(pidfile)]
    env = make_with(ENV, {}, [server])

    def kill_at(turn):
        if turn == 1:
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
            time.sleep(0.3)

    texts = [calls(("get", {"key": "color"})), calls(("get", {"key": "size"})), "done"]
    episode = play(env, tiny.renderer, texts, on_turn=kill_at)
    assert episode.stop_reason.value == "infra_failure"
    assert episode.attribution.value == "environment" and not episode.gradient_eligible
    step = episode.steps[1]
    assert step["infra_error"] and not step["policy_error"]
    failure = step["attempts"][-1]["calls"][0]["result"]["error"]
    assert failure["attribution"] == "environment" and "MCP server 'kv'" in failure["message"]
    assert step["calls"][0]["result"]["error"] == failure  # on the step's call, not only retries
    assert "tool 'get'" in episode.receipt.error and "MCP server 'kv'" in episode.receipt.error


def test_a_server_that_will_not_start_fails_the_episode_as_infrastructure(store, tmp_path, tiny):
    crash = tmp_path / "crash.py"
    crash.write_text("import sys; print('no config for the store', file=sys.stderr); sys.exit(3)")
    env = make_with(ENV, {}, [stdio(store)])
    env.toolboxes[0].server = env.toolboxes[0].server.model_copy(
        update={"command": ["python", str(crash)]}
    )
    episode = play(env, tiny.renderer, ["done"])
    assert episode.stop_reason.value == "infra_failure"
    assert episode.attribution.value == "environment"
    assert "reset failed" in episode.receipt.error
    assert "no config for the store" in episode.receipt.error  # the server's stderr


# ---- receipts and replay ----------------------------------------------------------------------
def test_receipts_name_the_server_and_replay_is_exact_without_it(store, tmp_path, tiny):
    env = make_with(ENV, {}, [stdio(store)])
    texts = [calls(("get", {"key": "color"})), calls(("delete", {"key": "color"})), "blue"]
    episode = play(env, tiny.renderer, texts, out=tmp_path / "run")
    receipt = episode.receipt
    (service,) = receipt.env["services"]
    assert service["name"] == "kv-store" and service["version"] == "1.0.0"
    assert service["transport"] == "stdio"
    assert receipt.tool_versions["get"].startswith("kv-store@1.0.0#")
    assert receipt.env["mcp"][0]["name"] == "kv"  # how to rebuild it
    # exact replay plays back the recorded results: no server needed
    store.unlink()
    (_, traj), *_ = read_run_trajectories(tmp_path / "run")
    report = asyncio.run(replay_exact([traj], renderer=tiny.renderer))
    assert report.ok, report.first_difference


def test_live_replay_reports_drift_after_the_servers_data_changes(store, tmp_path, tiny):
    env = make_with(ENV, {}, [stdio(store)])
    texts = [calls(("get", {"key": "color"})), "blue"]
    play(env, tiny.renderer, texts, out=tmp_path / "run")
    (_, traj), *_ = read_run_trajectories(tmp_path / "run")
    same = asyncio.run(replay_live([traj]))
    assert same.drifted == [], same.drifted
    store.write_text(json.dumps({"color": "green"}))
    changed = asyncio.run(replay_live([traj]))
    assert [d.step for d in changed.drifted] == [0]
    assert "'blue'" in changed.drifted[0].detail and "'green'" in changed.drifted[0].detail


# ---- the same over streamable HTTP ------------------------------------------------------------
def test_an_http_server_reads_writes_receipts_drift_and_outage(store, tmp_path, tiny, http):
    server = {"name": "kv", "url": http.url}
    env = make_with(ENV, {}, [server])
    assert env.tools["get"].version.startswith("kv-store@1.0.0#")
    texts = [
        calls(("get", {"key": "color"})),
        calls(("put", {"key": "color", "value": "red"})),
        "blue",
    ]
    episode = play(env, tiny.renderer, texts, out=tmp_path / "run")
    get, put = tool_calls(episode)
    assert get["result"]["content"] == "blue" and put["result"]["dry_run"]
    assert json.loads(store.read_text())["color"] == "blue"
    assert episode.receipt.env["services"][0]["transport"] == "http"
    (_, traj), *_ = read_run_trajectories(tmp_path / "run")
    assert asyncio.run(replay_exact([traj], renderer=tiny.renderer)).ok
    # the server is upgraded and its data changes: live replay says both
    http.stop()
    store.write_text(json.dumps({"color": "green"}))
    http.start(version="1.1.0")
    report = asyncio.run(replay_live([traj]))
    drifted = {d.step: d.detail for d in report.drifted}
    assert "kv-store@1.0.0" in drifted["tools"] and "kv-store@1.1.0" in drifted["tools"]
    assert "'green'" in drifted[0]
    # the server goes down mid-episode: the environment's failure, after retries
    env = make_with(ENV, {}, [server])

    def down(turn):
        if turn == 1:
            http.stop()

    texts = [calls(("get", {"key": "color"})), calls(("get", {"key": "size"})), "done"]
    episode = play(env, tiny.renderer, texts, on_turn=down)
    assert episode.stop_reason.value == "infra_failure"
    assert episode.attribution.value == "environment"
    assert episode.steps[1].get("retried", 0) >= 1  # a read over HTTP is worth retrying


def test_episodes_starting_at_once_share_one_worker_server(store):
    from tracerl.envs.mcp import client, pool

    server = stdio(store, scope="worker")
    envs = [make_with(ENV, {}, [server]) for _ in range(4)]

    async def start_all():
        await asyncio.gather(*(e.reset(e.sample_tasks(1)[0], 0) for e in envs))
        conns = [e.toolboxes[0].conn for e in envs]
        got = await asyncio.gather(*(e.tools["get"]({"key": "color"}) for e in envs))
        for e in envs:
            await e.close()
        return conns, got

    conns, got = asyncio.run(start_all())
    assert all(c is conns[0] for c in conns) and conns[0].alive()
    assert [r.content for r in got] == ["blue"] * 4
    # the worker's server dies between episodes: the next episode gets a new one
    pid = int(conns[0]._pidfile.read_text())
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while conns[0].alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    env = make_with(ENV, {}, [server])

    async def again():
        await env.reset(env.sample_tasks(1)[0], 0)
        try:
            return await env.tools["get"]({"key": "color"}), env.toolboxes[0].conn
        finally:
            await env.close()

    result, conn = asyncio.run(again())
    assert result.content == "blue" and conn is not conns[0]
    asyncio.run(client.on_hub(conn.close()))
    pool._POOL.clear()
