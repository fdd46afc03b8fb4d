"""docs/mcp.md's example as a user runs it: `tracerl check-env --config` and `tracerl train`
on an environment whose tool comes from an MCP server (examples/kv_server.py over stdio),
then exact and live replay of its episodes; and a server entry that cannot work is refused
before anything is written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tracerl.rollout.persist import read_run_trajectories

pytest.importorskip("mcp")

EXAMPLE = "examples/kv_lookup.yaml"
# the example on the tiny character model, a few steps (the warm start teaches it the call
# format, so its episodes reach the server). The warm start is as small as that needs: one
# reference episode per optimizer step (micro-batches of 1024 tokens hold one ~650-token
# episode), 16 episodes x 16 epochs = 256 steps: NLL 4.5 -> 0.07 (64 x 30, six episodes a
# step, reached 0.075 with 7.5 times the compute: 34 s of SFT on idle cores, and past the
# 900 s bound on loaded ones). Measured: 19 of the 96 episodes then read a value.
TINY = [
    "model.spec=tiny-chars",
    "model.temperature=1.0",
    "rollout.max_turn_tokens=80",
    "warm_start.tasks=16",
    "warm_start.epochs=16",
    "trainer.micro_batch_tokens=1024",
    "warm_start.lr=3e-3",
    "trainer.lr=1e-3",
    "trainer.group_size=8",
    "trainer.steps=3",
    "env.eval_tasks=4",
]


def tracerl(*args: str, code: int = 0, timeout: float = 900) -> str:
    cmd = [sys.executable, "-m", "tracerl.cli", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == code, done.stdout + done.stderr
    return done.stdout + done.stderr


def in_process(*args: str) -> str:
    """A command on a finished run, in this process (what it imports is imported already)."""
    from typer.testing import CliRunner

    from tracerl.cli import app

    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_check_env_covers_the_mcp_server():
    out = tracerl("check-env", "--config", EXAMPLE)
    assert "check_env(examples.kv_lookup:KvLookup): ok" in out
    assert "mcp servers: kv = kv-store@1.0.0 (stdio)" in out


def test_the_example_trains_the_tiny_model_with_its_mcp_tool(tmp_path):
    from examples.kv_server import demo_data

    out = tracerl("train", EXAMPLE, f"out_dir={tmp_path}", *TINY)
    assert "heldout success" in out
    run = tmp_path / "kv-lookup"
    trajectories = [t for _, t in read_run_trajectories(run)]
    assert len(trajectories) == 3 * 4 * 8
    receipt = trajectories[0].receipt
    assert receipt["env"]["services"][0]["version"] == "1.0.0"
    assert list(receipt["tool_versions"]) == ["get"]  # `tools: [get]` in the config
    # the warm-started model calls the server's tool, and the server answers with what its
    # store holds; a key the model garbles ("kk3") gets the server's own error, as a result
    calls = [
        (t, c)
        for t in trajectories
        for s in t.steps
        for c in s.get("calls", [])
        if c["action"]["tool"] == "get" and c["result"]["error"] is None
    ]
    served = [(t, c) for t, c in calls if not c["result"].get("is_error")]
    assert served, "no episode called the MCP tool"
    store = demo_data()
    assert all(c["result"]["content"] == store[c["action"]["args"]["key"]] for _, c in served)
    refused = [c["result"]["content"] for _, c in calls if c["result"].get("is_error")]
    assert all("no value under" in text for text in refused), refused
    # its episodes replay exactly (recorded results) and live (the server, no drift)
    t, _ = served[0]
    out = in_process("replay", str(run), "--episode", t.episode_id)
    assert "replayed exactly" in out
    out = in_process("replay", str(run), "--episode", t.episode_id, "--live")
    assert "no drift" in out


def test_a_server_that_cannot_start_is_refused_before_anything_is_written(tmp_path):
    bad = tmp_path / "bad_server.py"
    bad.write_text("import sys; print('cannot open the store', file=sys.stderr); sys.exit(1)")
    out = tracerl(
        "train",
        EXAMPLE,
        f"out_dir={tmp_path / 'runs'}",
        f'env.mcp=[{{name: kv, command: [python, "{bad}"]}}]',
        *TINY,
        code=2,
    )
    assert "env.mcp[0] (kv)" in out and "cannot open the store" in out
    assert not (tmp_path / "runs").exists()


def test_mcp_servers_need_a_tool_env(tmp_path):
    out = tracerl(
        "train",
        EXAMPLE,
        f"out_dir={tmp_path / 'runs'}",
        "env.name=tests.mcp_env:PlainEnv",
        *[a for a in TINY if not a.startswith("warm_start.")],
        "warm_start=null",
        code=2,
    )
    assert "env.mcp" in out and "not a ToolEnv" in out
    assert not (tmp_path / "runs").exists()


def test_the_example_server_is_the_one_the_docs_show():
    doc = Path("docs/mcp.md").read_text()
    assert Path(EXAMPLE).read_text().strip() in doc
