"""`tracerl check-env --config` checks the environment the config trains: its guard
(`env.side_effect_guard`) and `env.allow_real_writes` included. A recipe whose reward reads
the server's final state after real writes passes; its dry-run check runs on a copy with the
guard on and says so; with the guard on, a reward check that fails says its writes ran
simulated."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

pytest.importorskip("mcp")

ROOT = Path(__file__).resolve().parents[2]

# the notes recipe of docs/mcp.md: a server of its own per episode, in a folder of its own,
# whose final state the reward reads; the env's script writes the task's code there
ENV = """
from tracerl.envs import Action
from tracerl.types import ToolCall

from tests.mcp_env import NotesTasks


class WritesItsCode(NotesTasks):
    def check_script(self, task):
        note = ToolCall("call_0_0", "write_note", {"text": task["code"], "db": task["id"]})
        return [Action(text="", tool_calls=(note,)), Action(text="done", answer="done")]

    def reward(self, ctx):
        import json

        state = json.loads(ctx.final_state["notes"]["dump"])
        return 1.0 if ctx.task["code"] in state["notes"] else 0.0
"""


def _config(tmp_path: Path, **env: object) -> Path:
    server = {
        "name": "notes",
        "command": [
            sys.executable,
            str(ROOT / "tests/notes_server.py"),
            "--root",
            "${episode_dir}",
        ],
        "annotations": {"read_*": {"readOnlyHint": True}, "dump": {"readOnlyHint": True}},
        "final_state": [{"tool": "dump", "arguments": {"db": "${task.id}"}}],
    }
    (tmp_path / "realnotes.py").write_text(ENV)
    path = tmp_path / "notes.yaml"
    cfg = {"name": "notes", "env": {"name": "realnotes:WritesItsCode", "mcp": [server], **env}}
    path.write_text(yaml.safe_dump(cfg))
    return path


def _check_env(tmp_path: Path, config: Path, monkeypatch) -> tuple[int, str]:
    from tracerl.cli import app

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(ROOT))
    result = CliRunner().invoke(app, ["check-env", "--config", str(config)], env={"COLUMNS": "400"})
    print(result.output)
    # the console may wrap a line anywhere (its width is fixed when it is made): words only
    return result.exit_code, " ".join(result.output.split())


def test_check_env_runs_the_config_with_its_guard_off_and_real_writes(tmp_path, monkeypatch):
    config = _config(tmp_path, side_effect_guard="off", allow_real_writes=True)
    code, out = _check_env(tmp_path, config, monkeypatch)
    assert code == 0, out
    assert "side_effect_guard 'off': writes run for real on every task" in out
    assert "ok reward: " in out and "scripted episodes 2/2" in out  # the writes were real
    # the dry-run paths are still checked, under the guard, and the line says so
    assert "ok dry runs: run on a copy with side_effect_guard='dry_run'" in out
    assert "these writes were simulated" in out


def test_with_the_guard_on_a_failed_reward_check_says_its_writes_ran_simulated(
    tmp_path, monkeypatch
):
    code, out = _check_env(tmp_path, _config(tmp_path), monkeypatch)
    assert code == 1, out
    assert "FAIL reward: " in out and "its writes ran simulated, as dry runs" in out
    assert "env.side_effect_guard: off and env.allow_real_writes: true" in out
    assert "ok dry runs " in out and "ok dry runs:" not in out  # guarded: no note


def test_the_dry_run_check_of_an_env_built_with_the_guard_off():
    """On a copy with the guard on when the factory can build one (a config's, check-env's);
    skipped, saying why, when it cannot (a factory of one's own); as before with the guard on."""
    import asyncio

    from tracerl.envs.check import _dry_runs
    from tracerl.envs.registry import env_factory, make

    off = env_factory("refund_desk", {"side_effect_guard": "off"}, real_writes=True)
    said = asyncio.run(_dry_runs(off, None, 0))
    assert said is not None and said.startswith("note: run on a copy with side_effect_guard=")
    said = asyncio.run(_dry_runs(lambda: make("refund_desk", side_effect_guard="off"), None, 0))
    assert said is not None and said.startswith("note: skipped: the environment runs with ")
    assert asyncio.run(_dry_runs(env_factory("refund_desk"), None, 0)) is None
