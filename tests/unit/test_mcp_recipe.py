"""docs/mcp.md's recipes for a server somebody else wrote, combined as a user of a
tau2-bench-style server combines them: a server of its own per episode whose final state is
read with a task's field; one shared server keyed by an injected argument, checked by
`tracerl check-env --config`; and a model that names the keying argument itself, against a
server whose schemas forbid arguments they do not declare (tests/orders_server.py)."""

from __future__ import annotations

import asyncio
import json

import pytest
import yaml
from typer.testing import CliRunner

from tests.mcp_helpers import calls, policy, tool_calls
from tracerl.envs.registry import make_with
from tracerl.rollout.budget import Budgets, RolloutConfig
from tracerl.rollout.runner import run_episode

pytest.importorskip("mcp")

ORDERS_ENV = "tests.mcp_env:OrdersTasks"
NOTES_ENV = "tests.mcp_env:NotesTasks"


def orders(**extra):
    """The shared-server recipe: one server, each episode's world under its own key."""
    return {
        "name": "orders",
        "command": ["python", "tests/orders_server.py"],
        "scope": "worker",
        "annotations": {"list_*": {"readOnlyHint": True}, "get_*": {"readOnlyHint": True}},
        "inject": {"*": {"state_key": "${task.id}:${episode_id}"}},
        **extra,
    }


def play(env, tiny, texts, episode_id, **budgets):
    task = env.sample_tasks(1)[0]
    cfg = RolloutConfig(budgets=Budgets(**budgets), reserve=None)
    return asyncio.run(
        run_episode(env, task, policy(tiny.renderer, texts), cfg, seed=0, episode_id=episode_id)
    )


def test_a_server_of_its_own_per_episode_reads_its_final_state_with_a_task_field(tiny):
    from tracerl.envs.mcp.check import check_servers

    server = {
        "name": "notes",
        "command": ["python", "tests/notes_server.py", "--root", "${episode_dir}"],
        "annotations": {"read_*": {"readOnlyHint": True}, "dump": {"readOnlyHint": True}},
        "final_state": [{"tool": "dump", "arguments": {"db": "${task.id}"}}],
    }
    env = make_with(NOTES_ENV, {"side_effect_guard": "off"}, [server], real_writes=True)
    write = calls(("write_note", {"text": "4711", "db": "remember"}))
    ep = play(env, tiny, [write, "done"], "remember:a", write_actions=2)
    assert ep.receipt.error is None
    assert json.loads(ep.receipt.final_state["notes"]["dump"]) == {
        "db": "remember",  # the task's id
        "notes": ["4711"],
    }
    # check-env's two fresh starts fill the placeholders from a task of the env's
    said = asyncio.run(check_servers(lambda: make_with(NOTES_ENV, {}, [server]), 0))
    assert said == "note: notes = notes@2.1.0 (stdio)"


def test_check_env_passes_the_shared_server_keyed_per_episode(tmp_path):
    from tracerl.cli import app

    config = tmp_path / "orders.yaml"
    config.write_text(
        yaml.safe_dump({"name": "orders", "env": {"name": ORDERS_ENV, "mcp": [orders()]}})
    )
    result = CliRunner().invoke(app, ["check-env", "--config", str(config)])
    out = result.output
    assert result.exit_code == 0, out
    # each determinism run has a world of its own (the same one would hold two loads)
    assert "ok    reset determinism" in out and "ok    step determinism" in out
    assert "ok    mcp servers: orders = orders@0.3.0" in out  # started for a real task


def test_a_model_that_names_the_keying_argument_gets_its_own_episodes_world(tiny):
    env = make_with(ORDERS_ENV, {}, [orders()])
    schemas = {s["function"]["name"]: s["function"]["parameters"] for s in env.tool_schemas()}
    assert schemas["list_orders"] == {
        "type": "object",
        "properties": {},
        "required": [],
        "title": "list_ordersArguments",
        "additionalProperties": False,  # the server's strictness stays; the key is not shown
    }
    play(make_with(ORDERS_ENV, {}, [orders()]), tiny, ["A1 is pending"], "someone-else")
    theirs = {"state_key": "order-A1:someone-else"}  # another episode's world, by name
    sneaky = calls(("list_orders", theirs), ("get_order", {"order_id": "A1", **theirs}))
    ep = play(env, tiny, [sneaky, "pending"], "mine")
    listed, got = (c["result"] for c in tool_calls(ep))
    assert listed["error"] is None and got["error"] is None  # not invalid_arguments
    assert json.loads(listed["content"])["state_key"] == "order-A1:mine"  # injected, not theirs
    assert got["content"] == "pending"
