"""What a user of the gateway sees: the model named by its name (never its PyTorch
printout), sessions of `tracerl gateway` that replay exactly as ended, a refused request
that records nothing, and mistakes (a port in use or out of range, an unknown parser) told
in two lines with exit status 2 before the model loads."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import socket
import subprocess
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import yaml

from tests.command import TRACERL, run_tracerl, wait_healthy
from tracerl.config.run import AgentConfig
from tracerl.envs.parsers import get_parser
from tracerl.errors import UserError
from tracerl.gateway import Gateway, agent_backend
from tracerl.gateway.harness import HarnessEnv
from tracerl.models import load
from tracerl.rollout import BatchedHFSampler
from tracerl.rollout.budget import Budgets, RolloutConfig
from tracerl.rollout.remote import RemoteSampler
from tracerl.rollout.runner import Policy
from tracerl.rollout.sampler import ScriptedSampler

ROOT = Path(__file__).resolve().parents[2]
PYTHONPATH = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
"""`tests.agents` importable from any working directory."""


@pytest.fixture(scope="module")
def bundle():
    return load("tiny-random")


def _tracerl(args: list[str], cwd: Path, cache: Path) -> subprocess.CompletedProcess:
    return run_tracerl(args, cwd, cache, env={"PYTHONPATH": PYTHONPATH})


def _nothing_loaded(cache: Path) -> bool:
    return not cache.exists() or not any(cache.iterdir())


@pytest.fixture
def taken_port():
    """A port something listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- the served model's name ------------------------------------------------------------------


def test_a_policy_is_served_under_its_name_never_its_network(bundle):
    from tracerl.gateway.session import served_model

    hf = Policy(
        BatchedHFSampler(bundle.model), bundle.renderer, get_parser("json_list"), "tiny-random"
    )
    assert served_model(hf) == "tiny-random"  # the sampler's `model` is the network itself
    remote = RemoteSampler("http://gpu:8000", "Qwen/Qwen2.5-7B-Instruct")
    assert served_model(dataclasses.replace(hf, sampler=remote)) == "Qwen/Qwen2.5-7B-Instruct"
    remote.model = "tiny-random-1a2b3c4d@v4"  # the vLLM engine after a LoRA update
    assert served_model(dataclasses.replace(hf, sampler=remote)) == "tiny-random-1a2b3c4d@v4"
    scripted = ScriptedSampler.from_texts(bundle.renderer, lambda req: "5")
    assert served_model(dataclasses.replace(hf, sampler=scripted)) == "tiny-random"


async def names_the_model(task, client):
    """An agent that reports the model names its client sees."""
    listed = [m.id for m in (await client.models.list()).data]
    r = await client.chat.completions.create(
        model="x", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    return {"listed": listed, "answered_by": r.model}


def test_a_training_agent_sees_the_models_name_from_the_hf_engine(bundle):
    """With `agent:` and the in-process engine, `/v1/models` and each answer's ``model``
    name the model's spec, not ``LlamaForCausalLM(\\n  (model): ...``."""
    policy = Policy(
        BatchedHFSampler(bundle.model), bundle.renderer, get_parser("json_list"), bundle.spec
    )
    cfg = RolloutConfig(budgets=Budgets(steps=2), reserve=None, max_turn_tokens=4)
    run = SimpleNamespace(agent=AgentConfig(entry=f"{__name__}:names_the_model", timeout_s=60))

    async def go():
        with agent_backend(run, policy) as backend:
            return await backend.run_episode(
                HarnessEnv, {"id": "t"}, policy, cfg, seed=0, episode_id="t:s0:g0"
            )

    returned = asyncio.run(go()).receipt.agent["returned"]
    assert returned == {"listed": ["tiny-random"], "answered_by": "tiny-random"}


# ---- ports ------------------------------------------------------------------------------------


def test_the_gateways_bind_on_a_taken_port_is_a_user_error(taken_port):
    """A port taken between the check and the bind: the same two lines, not an OSError."""
    with pytest.raises(UserError) as e:
        Gateway("m", port=taken_port, option="agent.port").start()
    assert str(e.value) == (
        f"port {taken_port} on 127.0.0.1 is in use or not allowed (Address already in use)"
    )
    assert e.value.hint == "pick another with agent.port (or stop what listens there)"
    with pytest.raises(UserError) as e:
        Gateway("m", port=99999, option="agent.port").start()
    assert str(e.value) == "agent.port 99999: a port is a number from 0 to 65535"


def _agent_config(tmp_path: Path, **agent) -> Path:
    cfg = {
        "name": "agent-port",
        "out_dir": str(tmp_path / "runs"),
        "agent": {"entry": "tests.agents:solve", **agent},
        "model": {"spec": "tiny-random"},
        "env": {"name": "arithmetic", "parser": "json_list"},
        "trainer": {"steps": 1, "group_size": 2, "reward": "arithmetic"},
    }
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_train_with_agent_port_in_use_is_refused_before_the_model_loads(tmp_path, taken_port):
    config = _agent_config(tmp_path)
    cache = tmp_path / "cache"
    r = _tracerl(["train", str(config), f"agent.port={taken_port}"], tmp_path, cache)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 2 and "Traceback" not in r.stderr, r.stderr
    assert lines[0] == (
        f"error: {config}: agent.port: port {taken_port} on 127.0.0.1 is in use or not "
        "allowed (Address already in use)"
    )
    assert "agent.port" in lines[1]
    assert not (tmp_path / "runs" / "agent-port").exists() and _nothing_loaded(cache)


def test_train_with_agent_port_out_of_range_is_a_config_error(tmp_path):
    config = _agent_config(tmp_path)
    cache = tmp_path / "cache"
    r = _tracerl(["train", str(config), "agent.port=99999"], tmp_path, cache)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2
    assert "agent.port" in r.stderr and "65535" in r.stderr, r.stderr
    assert not (tmp_path / "runs" / "agent-port").exists() and _nothing_loaded(cache)


# ---- `tracerl gateway` ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("parser", "first"),
    [
        (
            "nosuchparser",
            "error: unknown action parser 'nosuchparser'; valid: hermes, json_list, search_r1",
        ),
        (
            "hermas",
            "error: unknown action parser 'hermas' (did you mean 'hermes'?); "
            "valid: hermes, json_list, search_r1",
        ),
    ],
)
def test_an_unknown_parser_is_refused_before_the_model_loads(tmp_path, parser, first):
    cache = tmp_path / "cache"
    args = ["gateway", "tiny-random", "--port", str(_free_port()), "--parser", parser]
    r = _tracerl(args, tmp_path, cache)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 2 and "Traceback" not in r.stderr, r.stderr
    assert lines[0] == first and "--parser" in lines[1]
    assert _nothing_loaded(cache)


@pytest.fixture(scope="module")
def gateway_run(tmp_path_factory):
    """`tracerl gateway tiny-random` driven as docs/gateway.md shows: a session answered
    once then ended with an answer, a request refused (400) in it, a session whose only
    request is refused, a session left open at Ctrl-C."""
    tmp = tmp_path_factory.mktemp("standalone")
    out, port = tmp / "gw", _free_port()
    args = ["gateway", "tiny-random", "--port", str(port), "--out", str(out)]
    proc = subprocess.Popen(
        [str(TRACERL), *args, "--max-turn-tokens", "8"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": PYTHONPATH},
    )
    base = f"http://127.0.0.1:{port}"
    seen: dict = {"out": out}
    try:
        wait_healthy(base)
        chat = base + "/v1/chat/completions"
        hi = {"messages": [{"role": "user", "content": "hi"}]}
        seen["answer"] = httpx.post(chat, json=hi, headers={"Authorization": "Bearer s1"}).json()
        seen["models"] = httpx.get(base + "/v1/models").json()
        bad = {**hi, "max_tokens": -1}
        seen["refused"] = httpx.post(chat, json=bad, headers={"Authorization": "Bearer bad"})
        seen["refused_in_s1"] = httpx.post(chat, json=bad, headers={"Authorization": "Bearer s1"})
        sessions = httpx.get(base + "/tracerl/sessions").json()["sessions"]
        seen["sessions"] = {s["session"]: s for s in sessions}
        seen["ended"] = httpx.post(base + "/tracerl/sessions/s1/end", json={"answer": "42"})
        httpx.post(chat, json=hi, headers={"Authorization": "Bearer s2"})  # open at Ctrl-C
    finally:
        proc.send_signal(signal.SIGINT)
        seen["output"] = proc.communicate(timeout=60)[0]
    seen["returncode"] = proc.returncode
    return seen


def test_tracerl_gateway_answers_under_the_models_name(gateway_run):
    answer = gateway_run["answer"]
    assert answer["model"] == "tiny-random", answer["model"][:80]
    assert [m["id"] for m in gateway_run["models"]["data"]] == ["tiny-random"]


def test_a_refused_request_opens_no_session_and_counts_nowhere(gateway_run):
    from tracerl.rollout.persist import read_run_trajectories

    assert gateway_run["returncode"] == 0, gateway_run["output"]
    for refused in (gateway_run["refused"], gateway_run["refused_in_s1"]):
        assert refused.status_code == 400 and "max_tokens" in refused.text
    assert set(gateway_run["sessions"]) == {"s1"}  # none opened for "bad"
    assert gateway_run["sessions"]["s1"]["requests"] == 1  # its refused request not counted
    assert gateway_run["ended"].json() == {"episode": "s1", "samples": 1}
    written = {t.receipt["episode_id"] for _, t in read_run_trajectories(gateway_run["out"])}
    assert written == {"s1", "s2"}


@pytest.mark.parametrize("session", ["s1", "s2"])
def test_tracerl_gateway_sessions_replay_exactly(gateway_run, session, tmp_path):
    """Ended with an answer (``s1``) or left open at Ctrl-C (``s2``): `tracerl replay` finds
    the stop that was recorded."""
    r = _tracerl(["replay", str(gateway_run["out"]), session], tmp_path, tmp_path / "cache")
    assert r.returncode == 0, (r.stdout, r.stderr)


def test_replay_of_a_standalone_session_still_catches_a_changed_ending(gateway_run, bundle):
    """The recorded answer is what decides the stop again: a receipt whose answer was
    removed no longer replays."""
    from tracerl.gateway.replay import replay_exact
    from tracerl.rollout.persist import read_run_trajectories

    (t,) = [t for _, t in read_run_trajectories(gateway_run["out"]) if t.episode_id == "s1"]
    assert t.receipt["agent"]["returned"] == "42"
    assert t.receipt["stop_reason"] in ("answered", "max_tokens")  # max_tokens: a cut answer
    ok = asyncio.run(replay_exact([t], renderer=bundle.renderer))
    assert ok.ok, ok.first_difference
    receipt = json.loads(json.dumps(t.receipt))
    receipt["agent"]["returned"] = None
    tampered = dataclasses.replace(t, receipt=receipt, _cache={})
    report = asyncio.run(replay_exact([tampered], renderer=bundle.renderer))
    assert not report.ok and "stop reason" in report.first_difference
