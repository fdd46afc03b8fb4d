"""Tools from real MCP servers (examples/kv_server.py, written with the `mcp` SDK), over
stdio and streamable HTTP: schemas, effects from annotations, dry runs, the write budget,
failures and whose they are, receipts, exact and live replay."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tracerl.envs import get_parser
from tracerl.envs.registry import make_with
from tracerl.rollout import ScriptedSampler
from tracerl.rollout.budget import Budgets, RolloutConfig
from tracerl.rollout.persist import EpisodeWriter, read_run_trajectories
from tracerl.rollout.replay import replay_exact, replay_live
from tracerl.rollout.runner import Policy, run_episode

pytest.importorskip("mcp")

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


# ---- what the model is offered ----------------------------------------------------------------
def test_a_servers_tools_are_offered_with_their_schemas_effects_and_versions(store, tiny):
    env = make_with(ENV, {}, [stdio(store)])
    tools = {t.name: t for t in env.tools}
    assert {"get", "put", "delete", "delete_preview", "rename"} <= set(tools)
    assert tools["get"].effect == "read" and tools["delete_preview"].effect == "read"
    assert tools["put"].effect == tools["delete"].effect == "write"
    assert tools["delete"].hints["destructiveHint"] and not tools["put"].hints["destructiveHint"]
    assert tools["get"].parameters["required"] == ["key"]
    assert tools["get"].version.startswith("kv-store@1.0.0#")
    conv = tiny.renderer.start([{"role": "user", "content": "hi"}], env.tool_schemas())
    prompt = tiny.renderer.decode(conv.token_ids)
    assert '"delete_preview"' in prompt and "Read the value stored under a key" in prompt


# ---- effects: reads run, writes are dry runs unless the task allows them ---------------------
def test_reads_run_and_writes_are_dry_runs_by_default(store, tiny):
    env = make_with(ENV, {}, [stdio(store)])
    texts = [calls(("get", {"key": "color"})), calls(("put", {"key": "color", "value": "red"}))]
    episode = play(env, tiny.renderer, [*texts, "red"])
    get, put = tool_calls(episode)
    assert get["result"]["content"] == "blue" and get["effect"] == "read"
    assert put["effect"] == "write" and put["result"]["dry_run"] is True
    assert put["result"]["effect"]["executed"] is False
    assert put["result"]["effect"]["arguments"] == {"key": "color", "value": "red"}
    assert "was not executed" in put["result"]["content"]
    assert json.loads(store.read_text())["color"] == "blue"  # nothing was written
    assert episode.stop_reason.value == "answered" and episode.attribution.value == "policy"
    assert episode.receipt.ledger["used"]["write_actions"] == 1


def test_writes_run_for_real_only_when_the_env_and_the_task_allow_it(store, tiny):
    texts = [calls(("put", {"key": "color", "value": "red"})), "done"]
    # the guard off but the task does not allow real writes: still a dry run
    env = make_with(ENV, {"side_effect_guard": "off"}, [stdio(store)])
    play(env, tiny.renderer, texts)
    assert json.loads(store.read_text())["color"] == "blue"
    # both allow it: the server is called and the store changes
    env = make_with(ENV, {"side_effect_guard": "off", "allow_real_writes": True}, [stdio(store)])
    (put,) = tool_calls(play(env, tiny.renderer, texts))
    assert put["result"]["dry_run"] is False and put["result"]["effect"]["executed"] is True
    assert json.loads(store.read_text())["color"] == "red"
    # a task that permits no write actions refuses the call before any server sees it
    env = make_with(ENV, {"effect": "read", "side_effect_guard": "off"}, [stdio(store)])
    (put,) = tool_calls(play(env, tiny.renderer, [calls(("delete", {"key": "size"})), "done"]))
    assert put["result"]["error"]["kind"] == "forbidden_tool" and put["policy_error"]
    assert "size" in json.loads(store.read_text())


def test_the_write_budget_counts_mcp_writes(store, tiny):
    env = make_with(ENV, {}, [stdio(store)])
    texts = [
        calls(("put", {"key": "a", "value": "1"})),
        calls(("delete", {"key": "color"})),
        "done",
    ]
    episode = play(env, tiny.renderer, texts, budgets=Budgets(write_actions=1))
    first, second = tool_calls(episode)
    assert first["result"]["dry_run"] and first["result"]["error"] is None
    assert "write budget is spent" in second["result"]["content"]
    assert episode.stop_reason.value == "write_blocked"
    assert episode.receipt.ledger["used"]["write_actions"] == 1


def test_declared_dry_run_paths_a_preview_tool_and_an_argument(store, tiny):
    server = stdio(store, dry_run={"delete": "tool:delete_preview", "rename": "argument:dry_run"})
    env = make_with(ENV, {}, [server])
    texts = [
        calls(("delete", {"key": "color"})),
        calls(("rename", {"key": "size", "new_key": "width"})),
        "done",
    ]
    delete, rename = tool_calls(play(env, tiny.renderer, texts))
    assert delete["result"]["content"] == "would delete color"  # the server's preview
    assert delete["result"]["effect"]["dry_run"] == "tool:delete_preview"
    assert rename["result"]["content"] == "would rename size to width"
    assert "dry_run" not in env.tools["rename"].parameters["properties"]  # tracerl sets it
    assert json.loads(store.read_text()) == {"color": "blue", "size": "large"}
    receipt_tools = {t["function"]["name"]: t for t in play_receipt_tools(env)}
    assert receipt_tools["delete"]["x-mcp"]["dry_run"] == "tool:delete_preview"


def play_receipt_tools(env):
    return [t.receipt_schema() for t in env.tools]


def test_a_config_overrides_annotations_because_servers_lie(store, tiny):
    lying = stdio(store, annotations={"get": {"readOnlyHint": False}})
    env = make_with(ENV, {}, [lying])
    (get,) = tool_calls(play(env, tiny.renderer, [calls(("get", {"key": "color"})), "done"]))
    assert get["effect"] == "write" and get["result"]["dry_run"]  # guarded like any write


@pytest.mark.parametrize(
    "server, problem",
    [
        ({"annotations": {"gett": {"readOnlyHint": True}}}, "does not offer"),
        ({"dry_run": {"delete": "tool:nope"}}, "no tool 'nope'"),
        ({"dry_run": {"put": "argument:dry_run"}}, "no boolean argument"),
        ({"dry_run": {"get": "refuse"}}, "not write tools"),
        ({"tools": ["get", "gett"]}, "'gett'. were asked for"),
    ],
)
def test_a_wrong_server_entry_is_refused_naming_it(store, server, problem):
    with pytest.raises(ValueError, match=problem):
        make_with(ENV, {}, [stdio(store, **server)])


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
    broken, bad, big = tool_calls(cfg_episode)
    attempts = cfg_episode.steps[3]["attempts"]
    slow = attempts[-1]["calls"][0]
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


def test_a_preview_the_config_declares_read_only_is_accepted(store):
    # a preview tool the server forgot to annotate: the config's override counts
    server = stdio(
        store,
        annotations={"delete_preview": {"readOnlyHint": None}, "big": {"readOnlyHint": False}},
        dry_run={"delete": "tool:big"},
    )
    with pytest.raises(ValueError, match="'big' is not annotated read-only"):
        make_with(ENV, {}, [server])
    server["annotations"]["big"] = {"readOnlyHint": True}
    env = make_with(ENV, {}, [server])
    assert env.tools["delete"].dry_run_how == "tool:big"


def test_an_env_mixes_its_own_tools_and_a_servers(store, tiny):
    """refund_desk's native tools and the kv server's, side by side (prefixed)."""
    env = make_with("refund_desk", {}, [stdio(store, prefix="kv_", tools=["get", "put"])])
    assert {"lookup_order", "issue_refund", "kv_get", "kv_put"} <= set(env.tools.names())
    task = env.sample_tasks(1)[0]
    texts = [
        calls(("lookup_order", {"order_id": task["order_id"]}), ("kv_get", {"key": "color"})),
        calls(("kv_put", {"key": "note", "value": "refund checked"})),
        "done",
    ]
    cfg = RolloutConfig(budgets=Budgets(write_actions=2), reserve=None)
    episode = asyncio.run(
        run_episode(env, task, policy(tiny.renderer, texts), cfg, seed=0, episode_id="m:s0")
    )
    lookup, get, put = tool_calls(episode)
    assert lookup["result"]["error"] is None and get["result"]["content"] == "blue"
    assert put["effect"] == "write" and put["result"]["effect"]["tool"] == "put"
    assert put["result"]["dry_run"] and "note" not in json.loads(store.read_text())
    assert episode.receipt.tool_versions["kv_get"].startswith("kv-store@1.0.0#")
    assert episode.receipt.tool_versions["lookup_order"] == "1"
