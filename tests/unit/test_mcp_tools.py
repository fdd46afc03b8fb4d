"""Tools from a real MCP server (examples/kv_server.py, written with the `mcp` SDK): what
the model is offered, effects from annotations, dry runs, the write budget, a config's
overrides and mistakes, an env mixing its own tools with a server's."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.mcp_helpers import (
    ENV,
    calls,
    play,
    policy,
    stdio,
    tool_calls,
)
from tracerl.envs.registry import make_with
from tracerl.rollout.budget import Budgets, RolloutConfig
from tracerl.rollout.runner import run_episode

pytest.importorskip("mcp")


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
        ({"annotations": {"gett": {"readOnlyHint": True}}}, "match no tool of the server"),
        ({"inject": {"get": {"tenant": "t"}}}, "no such property"),
        ({"dry_run": {"delete": "tool:nope"}}, "no tool 'nope'"),
        ({"dry_run": {"put": "argument:dry_run"}}, "no boolean argument"),
        ({"dry_run": {"get": "refuse"}}, "not write tools"),
        ({"tools": ["get", "gett"]}, "'gett'. were asked for"),
    ],
)
def test_a_wrong_server_entry_is_refused_naming_it(store, server, problem):
    with pytest.raises(ValueError, match=problem):
        make_with(ENV, {}, [stdio(store, **server)])


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
