"""An OpenEnv environment from a config alone: `tracerl check-env` passes on it, and the
example config trains a tiny model for two steps, each episode a session of its own on the
server tracerl started (once, before the first episode; stopped at the end: when the
process exits, which `tracerl check-env` shows, and by the exit hook in process), scored by
the environment's own step reward, evaluated on held-out seeds, its receipts naming
openenv-core's release."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest

from tests.adapters import TINY, trains_two_steps
from tests.openenv_arith import openenv_python
from tests.ownpkg import tracerl
from tracerl.config.loading import load_config
from tracerl.envs.adapters.openenv import stop_all
from tracerl.rollout.persist import read_run_trajectories

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "openenv_arith.yaml"


@pytest.fixture(scope="module", autouse=True)
def servers():
    """Skips the module without openenv-core; stops the servers its tests start."""
    openenv_python()
    yield
    stop_all()


def test_check_env_passes_on_the_openenv_config(monkeypatch):
    mark = _mark()
    monkeypatch.setenv("TRACERL_TEST_MARK", mark)  # the server it starts inherits it
    result = tracerl("check-env", "--config", str(CONFIG), cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "splits: train, heldout" in result.stdout and "FAIL" not in result.stdout
    assert "reward: attribution, openenv_reward; scripted episodes 2/2" in result.stdout
    assert _gone(mark), "the server check-env started outlived it"


def test_the_example_config_trains_a_tiny_model_for_two_steps(tmp_path):
    mark = _mark()
    marked = f"env.kwargs.env_vars.TRACERL_TEST_MARK={mark}"  # in its server's environment
    cfg = load_config(CONFIG, [f"out_dir={tmp_path}", *TINY, marked])
    trajs = trains_two_steps(cfg, "openenv_reward")
    assert len(_servers(mark)) == 1  # one server for the run, kept for the process
    stop_all()  # what the process's exit runs
    assert _gone(mark), "the server the run started outlived the exit hook"
    run = cfg.run_dir
    assert len(trajs) == 8  # 2 steps x 2 tasks x 2 members
    release = openenv_version()
    for t in trajs:
        r = t.receipt
        assert r["env"]["name"] == "openenv"
        assert r["env"]["version"] == f"1.0/openenv-core-{release}/ArithEnvironment-1.0.0"
        (service,) = r["env"]["services"]
        assert service["protocol"] == "openenv-ws" and service["openenv_core"] == release
        assert r["task"]["split"] == "train" and r["task"]["reset"]["seed"] < 50
        (scored,) = [c for c in t.reward["components"] if c["name"] == "openenv_reward"]
        assert scored["decided"] and t.reward["attribution"] == "policy"
        if r["stop_reason"] == "answered":  # each episode its own session, reset with its id
            state = {"episode_id": r["episode_id"], "step_count": 1}
            assert r["final_state"]["openenv_state"] == state
        else:  # a random model's reply the token limit cut is no action: 0, the policy's
            assert r["stop_reason"] == "max_tokens" and scored["value"] == 0.0
            assert scored["evidence"]["why"] == "no action reached the environment"
    evaluated = [t for _, t in read_run_trajectories(run / "eval")]
    assert evaluated and all(t.receipt["task"]["split"] == "heldout" for t in evaluated)
    assert all(t.receipt["task"]["reset"]["seed"] >= 5_000_000 for t in evaluated)


def _mark() -> str:
    if not Path("/proc/self/environ").is_file():
        pytest.skip("finds the servers by their environment in Linux's /proc")
    return f"openenv-test-{uuid.uuid4().hex}"


def _marked(mark: str) -> list[int]:
    """The live processes (other than this one) whose environment holds `mark`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if mark.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:  # gone meanwhile, or not ours
                continue
    return found


def _servers(mark: str) -> list[int]:
    """Those of them that are servers, not the guard each runs behind."""
    guard = b"tracerl.engines.guard"
    return [p for p in _marked(mark) if guard not in _cmdline(p)]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _gone(mark: str, within_s: float = 15.0) -> bool:
    deadline = time.monotonic() + within_s
    while _marked(mark):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def openenv_version() -> str:
    import subprocess

    code = "import importlib.metadata as m; print(m.version('openenv-core'))"
    return subprocess.run(
        [openenv_python(), "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
