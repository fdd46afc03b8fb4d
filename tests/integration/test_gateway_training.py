"""`tracerl train` trains an unmodified OpenAI-SDK agent (`tests.agents:arithmetic`, no
tracerl import) through the gateway, exactly as it trains tracerl's own episodes of the
same environment: the same rewards and losses step for step. The run directory then works
with every command: report, triage, show, replay (exact and live), readiness."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tracerl.rollout.persist import read_run_trajectories

ARGS = ["trainer.steps=10", "trainer.checkpoint_every=5", "env.eval_tasks=4"]
AGENT = "agent=tests.agents:arithmetic"


def tracerl(*args: str, timeout: float = 900) -> str:
    return finish(start(*args), timeout)


def start(*args: str, **env: str) -> subprocess.Popen:
    """The real `tracerl` command, as a user starts it."""
    cmd = [sys.executable, "-m", "tracerl.cli", *args]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **env}
    )


def finish(proc: subprocess.Popen, timeout: float = 900) -> str:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out + err
    return out


def in_process(*args: str) -> str:
    """A command on a finished run, in this process (what it imports is imported already)."""
    from typer.testing import CliRunner

    from tracerl.cli import app

    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def metrics(run: Path) -> list[dict]:
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [m for m in lines if m.get("phase") == "train"]


def test_an_openai_sdk_agent_trains_as_native_episodes_do(tmp_path):
    config = "configs/learn-arithmetic.yaml"
    # two independent runs, side by side: one thread each, so two cores run both at once
    one = {"OMP_NUM_THREADS": "1"}
    # each turn decoded alone: which turns share a batch depends on when the agent's requests
    # reach the gateway, and a forward's last bits on its batch-mates (a matmul's blocking,
    # a row's padding), enough to flip a token now and then on a busy machine; alone, the
    # same seed gives the same tokens whatever the timing
    alone = "model.max_batch_size=1"
    runs = [
        start("train", config, f"out_dir={tmp_path / 'native'}", *ARGS, alone, **one),
        start("train", config, f"out_dir={tmp_path / 'agent'}", *ARGS, alone, AGENT, **one),
    ]
    for proc in runs:
        finish(proc)
    native, agent = (metrics(tmp_path / k / "learn-arithmetic") for k in ("native", "agent"))
    assert len(agent) == len(native) == 10
    for a, b in zip(agent, native, strict=True):
        assert abs(a["train/reward_mean"] - b["train/reward_mean"]) < 1e-6, (a["step"], a, b)
        assert abs(a["train/loss"] - b["train/loss"]) < 1e-5
        assert a["rollout/gradient_eligible_rate"] == 1.0
    rewards = [m["train/reward_mean"] for m in agent]
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.05, rewards  # it learns

    run = tmp_path / "agent" / "learn-arithmetic"
    trajectories = [t for _, t in read_run_trajectories(run)]
    assert all(t.receipt["agent"]["entry"] == "tests.agents:arithmetic" for t in trajectories)
    episode = trajectories[0].episode_id

    out = in_process("replay", str(run), "--episode", episode)
    assert "replayed exactly" in out
    out = in_process("replay", str(run), "--episode", episode, "--live")
    assert "drift" not in out.lower() or "no drift" in out.lower(), out
    assert "100 episodes: " in in_process("triage", str(run))
    in_process("report", str(run))
    assert (run / "report" / "index.html").exists()
    pages = list((run / "report").rglob("*.html"))
    assert any("tests.agents:arithmetic · 1 requests" in p.read_text() for p in pages)
    assert "tests.agents:arithmetic · 1 requests" in in_process("show", str(run), episode)


def test_an_agent_trains_asynchronously_too(tmp_path):
    tracerl(
        "train",
        "configs/learn-arithmetic.yaml",
        f"out_dir={tmp_path}",
        "trainer.steps=3",
        "trainer.group_size=8",  # the config's 32 cost 4 times as much, asserting the same
        "env.eval_tasks=2",
        "trainer.mode=async",
        AGENT,
    )
    steps = metrics(tmp_path / "learn-arithmetic")
    assert len(steps) == 3 and all(m["rollout/gradient_eligible_rate"] == 1.0 for m in steps)


def test_eval_of_an_agent_config_runs_the_agent(tmp_path):
    out = tmp_path / "eval"
    tracerl("eval", "configs/learn-arithmetic.yaml", AGENT, "--out", str(out), "--n", "3")
    trajectories = [t for _, t in read_run_trajectories(out / "eval")]  # the evaluation's
    assert len(trajectories) == 3
    assert all(t.receipt["agent"]["entry"] == "tests.agents:arithmetic" for t in trajectories)


def test_readiness_measures_an_agent(tmp_path):
    out = tracerl(
        "readiness",
        "configs/learn-arithmetic.yaml",
        AGENT,
        "env.tasks_per_step=2",
        "trainer.group_size=4",
        "--json",
    )
    report = json.loads(out)
    env = next(c for c in report["checks"] if c["question"] == "environment")
    assert env["numbers"]["replayed"] > 0
    assert env["numbers"]["replay_drift_rate"] == 0.0
    assert env["numbers"]["env_error_rate"] == 0.0


def test_the_documented_example_trains(tmp_path):
    """docs/gateway.md's example, as a user runs it (a few steps)."""
    out = tracerl(
        "train",
        "examples/calculator_agent.yaml",
        f"out_dir={tmp_path}",
        "trainer.steps=3",
        "trainer.group_size=4",  # the example's 16: 4 times the episodes, asserting the same
        "env.eval_tasks=4",
    )
    assert "heldout success" in out
    run = tmp_path / "calculator-agent"
    steps = metrics(run)
    assert len(steps) == 3 and all(m["train/loss"] == m["train/loss"] for m in steps)
    trajectories = [t for _, t in read_run_trajectories(run)]
    agent = trajectories[0].receipt["agent"]
    assert agent["entry"] == "examples.calculator_agent:solve" and agent["requests"] >= 1
    assert trajectories[0].receipt["tool_schemas"][0]["function"]["name"] == "add"
