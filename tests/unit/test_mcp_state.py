"""A third-party MCP server that keeps state in files (tests/notes_server.py: no
annotations, a database per ``db`` argument, one shared data folder by default), as a new
user meets it: shared naively, a later episode sees an earlier one's writes and a wrong
policy scores; configuration alone keeps episodes apart (an argument injected per episode,
or a server of its own in a folder of its own), patterns annotate its tools, YAML's ``off``
turns the guard off, and a reward grades the server's final state, read before it closes."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from tests.mcp_helpers import calls, policy, tool_calls
from tracerl.config.loading import load_config
from tracerl.envs.registry import make_with
from tracerl.rewards.compose import RewardContext
from tracerl.rollout.budget import Budgets, RolloutConfig
from tracerl.rollout.runner import run_episode

pytest.importorskip("mcp")

ENV = "tests.mcp_env:NotesTasks"
READS = {"read_*": {"readOnlyHint": True}, "dump": {"readOnlyHint": True}}


def writer(server):
    """The env with its guard off and every task allowed to write for real."""
    return make_with(ENV, {"side_effect_guard": "off"}, [server], real_writes=True)


def notes(tmp_path, **extra):
    """The server with a data folder of the test's own (it is shared by its episodes)."""
    command = ["python", "tests/notes_server.py", "--root", str(tmp_path / "data")]
    return {"name": "notes", "command": command, "annotations": READS, **extra}


def episode(env, tiny, texts, episode_id):
    task = env.sample_tasks(1)[0]
    cfg = RolloutConfig(budgets=Budgets(write_actions=2), reserve=None)
    return run_episode(env, task, policy(tiny.renderer, texts), cfg, seed=0, episode_id=episode_id)


def score(env, ep):
    return env.reward(RewardContext.from_trajectories(ep.trajectories, lambda _: None))


RIGHT = [calls(("write_note", {"text": "4711"})), "done"]
WRONG = [calls(("read_notes", {})), "done"]  # writes nothing: it must not score


def _two(tmp_path, tiny, server, *, together=False):
    """A right episode and a wrong one on the same task (after it, or at the same time)."""

    async def both():
        right = episode(writer(server), tiny, RIGHT, "remember:a")
        wrong = episode(writer(server), tiny, WRONG, "remember:b")
        if together:
            return await asyncio.gather(right, wrong)
        return [await right, await wrong]

    return asyncio.run(both())


def test_shared_naively_a_wrong_policy_scores_on_an_earlier_episodes_write(tmp_path, tiny):
    server = notes(tmp_path, scope="worker", final_state=["dump"])
    right, wrong = _two(tmp_path, tiny, server)
    env = writer(server)
    assert score(env, right) == 1.0
    assert score(env, wrong) == 1.0  # the leak this file is about


def test_an_argument_injected_per_episode_keeps_one_shared_servers_episodes_apart(tmp_path, tiny):
    server = notes(
        tmp_path, scope="worker", inject={"*": {"db": "${episode_id}"}}, final_state=["dump"]
    )
    env = writer(server)
    assert "db" not in json.dumps(env.tool_schemas())  # the model neither sees nor sets it
    right, wrong = _two(tmp_path, tiny, server, together=True)
    assert score(env, right) == 1.0 and score(env, wrong) == 0.0
    assert json.loads(right.receipt.final_state["notes"]["dump"]) == {
        "db": "remember:a",
        "notes": ["4711"],
    }
    assert tool_calls(wrong)[0]["result"]["content"] == "(no notes)"
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["remember_a.json"]


def test_a_model_cannot_set_an_injected_argument(tmp_path, tiny):
    server = notes(tmp_path, inject={"*": {"db": "${episode_id}"}}, final_state=["dump"])
    sneaky = [calls(("read_notes", {"db": "remember:a"})), "done"]  # another episode's
    asyncio.run(episode(writer(server), tiny, RIGHT, "remember:a"))
    ep = asyncio.run(episode(writer(server), tiny, sneaky, "remember:b"))
    assert tool_calls(ep)[0]["result"]["content"] == "(no notes)"


def test_a_server_of_its_own_in_a_folder_of_its_own_per_episode(tmp_path, tiny):
    server = {
        "name": "notes",
        "command": ["python", "tests/notes_server.py", "--root", "${episode_dir}"],
        "annotations": READS,
        "final_state": [{"tool": "dump", "key": "dump"}],
    }
    env = writer(server)
    right, wrong = _two(tmp_path, tiny, server, together=True)
    assert score(env, right) == 1.0 and score(env, wrong) == 0.0
    folders = [t.receipt["final_state"] for t in right.trajectories]
    assert folders and all(f == right.receipt.final_state for f in folders)


def test_a_server_whose_start_needs_the_episode_cannot_be_shared():
    from tracerl.envs.mcp.config import McpServer

    with pytest.raises(ValueError, match=r"\$\{episode_dir\}.*scope: worker.*scope: episode"):
        McpServer(name="n", command=["x", "${episode_dir}"], scope="worker")


def test_patterns_annotate_a_server_that_declares_nothing_and_check_env_warns(
    tmp_path, tiny, caplog
):
    from tracerl.envs.mcp import tools as mcp_tools

    mcp_tools._WARNED.discard("notes")
    with caplog.at_level(logging.WARNING, logger="tracerl"):
        bare = make_with(ENV, {}, [{**notes(tmp_path), "annotations": {}}])
    assert {t.name: t.effect for t in bare.tools} == {
        "dump": "write",
        "read_notes": "write",
        "write_note": "write",
    }
    assert "declares no annotations on any of its 3 tools" in caplog.text
    env = make_with(ENV, {}, [notes(tmp_path)])
    assert {t.name: t.effect for t in env.tools} == {
        "dump": "read",
        "read_notes": "read",
        "write_note": "write",
    }
    with pytest.raises(ValueError, match=r"`annotations` names \['list_\*'\], which match no"):
        make_with(ENV, {}, [{**notes(tmp_path), "annotations": {"list_*": {}}}])

    # check-env's server check (two fresh starts) says so as a warning, and passes
    from tracerl.envs.mcp.check import check_servers

    said = asyncio.run(
        check_servers(lambda: make_with(ENV, {}, [{**notes(tmp_path), "annotations": {}}]), 0)
    )
    assert said.startswith("warning: MCP server 'notes'") and "; note: notes = notes@2.1.0" in said


def test_the_final_state_is_read_only_and_its_failure_is_the_environments(tmp_path, tiny):
    with pytest.raises(ValueError, match="final_state calls 'write_note', which is not annot"):
        make_with(ENV, {}, [notes(tmp_path, final_state=["write_note"])])
    bad = notes(tmp_path, final_state=[{"tool": "dump", "arguments": {"db": "no such db!"}}])
    ep = asyncio.run(episode(writer(bad), tiny, RIGHT, "remember:a"))
    assert ep.attribution.value == "environment" and not ep.gradient_eligible
    assert "final_state dump" in ep.receipt.error


def test_yaml_off_turns_the_guard_off_and_real_writes_are_a_config_key(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "name: x\nenv:\n  name: arithmetic\n  side_effect_guard: off\n  allow_real_writes: true\n"
    )
    cfg = load_config(path)
    assert cfg.env.side_effect_guard == "off"  # YAML read `off` as false: it means off
    env = cfg.env.factory()()
    assert env.side_effect_guard == "off" and env.allow_real_writes
    env.task = {"id": "t"}
    assert env.real_writes  # every task, without a flag of its own
    path.write_text("name: x\nenv:\n  name: arithmetic\n  side_effect_guard: on\n")
    with pytest.raises(Exception, match="YAML reads an unquoted on, yes or true as true"):
        load_config(path)
    path.write_text("name: x\nenv:\n  name: arithmetic\n  allow_real_writes: true\n")
    with pytest.raises(Exception, match=r"needs env\.side_effect_guard: off"):
        load_config(path)
