"""The OpenEnv adapter against real OpenEnv servers (openenv-core's own, serving the tests'
arithmetic environment, and the echo environment openenv's template writes): check_env
passes; an episode is a session of its own, reset with the task's seed; the reward is the
environment's step reward; a malformed action is the policy's 0; a server that cannot be
reached, dies mid-episode, raises or builds an observation its class refuses is the
environment's failure; an environment not done after the reply is undecided (unless
single_step); a server at its session limit makes the next episode wait (with a warning);
another server on the port is never taken for ours; tracerl's client sees what openenv's own
client sees."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.openenv_arith import openenv_python, problem, score, solve
from tracerl.envs import get_parser, make
from tracerl.envs.adapters.openenv import OpenEnv, ServerError, stop_all
from tracerl.envs.adapters.openenv.client import Session
from tracerl.envs.parsers import Action
from tracerl.errors import UserError
from tracerl.rewards import RewardContext
from tracerl.rewards.compose import compose
from tracerl.rewards.resolve import resolve_reward
from tracerl.rollout.env_check import check_env
from tracerl.rollout.reference import reference_policy
from tracerl.rollout.runner import run_episode
from tracerl.types import Attribution, FaultKind, StopReason

APP = "tests.openenv_arith.server:app"
SOLVE = "tests.openenv_arith:solve"


@pytest.fixture(scope="module", autouse=True)
def servers():
    """Skips the module without openenv-core; the servers its tests start are stopped (all
    their processes) at the end."""
    openenv_python()
    yield
    stop_all()


def _env(**kwargs) -> OpenEnv:
    return make("openenv", **{"app": APP, "check_actions": SOLVE, **kwargs})


def _episode(env: OpenEnv, task: dict, reply: str):
    """Reset, one reply, the step's result and the env's own reward of it."""

    async def play():
        await env.reset(task, 0)
        try:
            return await env.step(Action(text=reply, answer=reply))
        finally:
            await env.close()

    result = asyncio.run(play())
    ctx = RewardContext(
        task=task,
        answer=result.info.get("answer"),
        steps=[{"step": 0, "info": result.info}],
        stop_reason="answered",
        attribution=Attribution.POLICY,
    )
    reward = resolve_reward(None, None, env)
    return result, compose(reward.spec, ctx, reward.functions)


def test_an_openenv_environment_passes_check_env(base_tokenizer):
    from tracerl.models.render import ChatRenderer

    report = check_env(_env, renderer=ChatRenderer(base_tokenizer), raise_on_failure=False)
    assert report.ok, str(report)
    assert "splits: train, heldout" in report.passed
    assert "reward: attribution, openenv_reward; scripted episodes 2/2" in report.passed


def test_an_episode_resets_the_tasks_seed_in_a_session_of_its_own():
    env = _env()
    train, heldout = env.sample_tasks(8, seed=3), env.sample_tasks(8, seed=3, split="heldout")
    assert train == _env().sample_tasks(8, seed=3) and json.loads(json.dumps(train)) == train
    assert not {t["reset"]["seed"] for t in train} & {t["reset"]["seed"] for t in heldout}
    task = train[0]
    messages = asyncio.run(env.reset(task, 0))
    assert messages == [{"role": "user", "content": problem(task["reset"]["seed"])[0]}]
    # the version names openenv-core's release (in the server's Python) and the environment
    release = subprocess.run(
        [
            openenv_python(),
            "-c",
            "import importlib.metadata as m; print(m.version('openenv-core'))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert env.version == f"1.0/openenv-core-{release}/ArithEnvironment-1.0.0"
    (service,) = env.services()
    assert service["openenv_core"] == release and service["protocol"] == "openenv-ws"

    async def two_at_once():
        # two episodes interleaved on one server: each answers its own question
        a, b = _env(), _env()
        a.episode_id, b.episode_id = "ep-a", "ep-b"
        await a.reset(train[1], 0)
        await b.reset(train[2], 0)
        rb = await b.step(Action(text=solve(train[2]), answer=""))
        ra = await a.step(Action(text=solve(train[1]), answer=""))
        states = await a.final_state(), await b.final_state()
        await a.close()
        await b.close()
        return ra, rb, states

    ra, rb, states = asyncio.run(two_at_once())
    assert ra.info["openenv"]["reward"] == rb.info["openenv"]["reward"] == 1.0
    assert [s["openenv_state"] for s in states] == [
        {"episode_id": "ep-a", "step_count": 1},
        {"episode_id": "ep-b", "step_count": 1},
    ]
    asyncio.run(env.close())


def test_the_reward_is_the_environments_own_step_reward():
    env = _env()
    for task in env.sample_tasks(3, seed=0):
        gold = problem(task["reset"]["seed"])[1]
        for reply in (gold, str(int(gold) + 1), f"{gold}0", "x"):
            result, b = _episode(env, task, reply)
            assert result.terminated and result.info["openenv"]["done"] is True
            assert b.decided and b.attribution is Attribution.POLICY
            assert b.total == pytest.approx(score(reply, gold)), reply
            assert b.component("openenv_reward").evidence["rewards"] == [b.total]
        assert _episode(env, task, gold)[1].succeeded
        assert not _episode(env, task, "x")[1].succeeded


def test_a_reply_that_is_no_action_is_the_policys_zero():
    task = _env().sample_tasks(1, seed=0)[0]
    gold = solve(task)
    env = _env(action="json")  # the reply must be the action, as JSON
    assert _episode(env, task, json.dumps({"message": gold}))[1].succeeded
    fenced = f"```json\n{json.dumps({'message': gold})}\n```"
    assert _episode(env, task, fenced)[1].succeeded
    for reply, why in (
        (f"the sum is {gold}", "not a JSON action"),
        (gold, "not an object"),
        (json.dumps({"msg": gold}), "VALIDATION_ERROR"),  # refused, and unfit for its schema
        (json.dumps({"message": 7}), "the action's schema: message: 7 is not of type 'string'"),
    ):
        result, b = _episode(_env(action="json"), task, reply)
        assert not result.calls  # nothing the environment failed at
        assert b.total == 0.0 and b.decided and b.attribution is Attribution.POLICY
        assert why in b.component("openenv_reward").evidence["why"]


def test_a_server_that_dies_mid_episode_is_the_environments_failure(base_tokenizer):
    from tracerl.models.render import ChatRenderer

    class Dying(OpenEnv):
        async def setup(self, task, seed):
            messages = await super().setup(task, seed)
            os.killpg(self.served.server_pid, signal.SIGKILL)  # the server crashes
            self.served.process.wait()  # its guard ends with it
            return messages

    tasks = _env().sample_tasks(2, seed=0)
    renderer = ChatRenderer(base_tokenizer)
    policy = reference_policy(renderer, "test", _env(), tasks, get_parser("json_list"))
    dying = Dying(app=APP, check_actions=SOLVE)
    episode = asyncio.run(run_episode(dying, tasks[0], policy, seed=0))
    assert episode.stop_reason is StopReason.INFRA_FAILURE
    assert episode.attribution is Attribution.ENVIRONMENT and not episode.gradient_eligible
    (step,) = episode.steps
    (call,) = step["calls"]
    assert call["infra_error"] and call["observation"]["status"] == "server_error"
    assert "the session ended" in episode.receipt.error
    # the next episode gets a server again: started anew before its clock
    again = asyncio.run(run_episode(_env(), tasks[1], policy, seed=0))
    assert again.stop_reason is StopReason.ANSWERED and again.attribution is Attribution.POLICY


def test_an_unreachable_or_raising_server_is_the_environments_failure():
    from tracerl.envs.adapters.openenv.server import free_port

    with pytest.raises(ServerError, match="does not answer"):
        make("openenv", base_url=f"http://127.0.0.1:{free_port()}", start_timeout_s=2).prepare()
    with pytest.raises(ServerError, match="cannot run no-such-server: not an executable"):
        make("openenv", command=["no-such-server", "--port", "{port}"]).prepare()
    with pytest.raises(ServerError, match=r"did not start \(it exited with status 3\)") as e:
        make("openenv", command=["bash", "-c", "echo broken; exit 3", "{port}"]).prepare()
    assert "broken" in str(e.value).split("its log:")[1]
    slow = ["bash", "-c", 'echo "$1" loading; sleep 60', "{port}", "still"]
    with pytest.raises(ServerError, match=r"did not start \(not ready in time") as e:
        make("openenv", command=slow, start_timeout_s=2).prepare()
    assert "still loading" in str(e.value).split("its log:")[1]  # read before it was stopped
    # the environment raises while stepping: its own bug, never the policy's
    task = _env().sample_tasks(1)[0]
    result, _ = _episode(_env(), task, "raise")
    (call,) = result.calls
    assert call.fault.attribution is Attribution.ENVIRONMENT and not call.fault.retryable
    assert call.fault.kind is FaultKind.SERVER_ERROR and "EXECUTION_ERROR" in call.fault.message


def test_an_observation_the_environment_cannot_build_is_its_failure(base_tokenizer):
    """openenv-core answers VALIDATION_ERROR for it as for an action that does not fit; this
    action fits the action's schema, so the environment broke, not the policy."""
    from tracerl.models.render import ChatRenderer

    task = _env().sample_tasks(1, seed=0)[0]
    for env, reply in ((_env(), "misreport"), (_env(action="json"), '{"message": "misreport"}')):
        result, _ = _episode(env, task, reply)
        (call,) = result.calls
        assert call.fault.attribution is Attribution.ENVIRONMENT and not call.fault.retryable
        assert "VALIDATION_ERROR" in call.fault.message and "reward" in call.fault.message
    renderer, parser = ChatRenderer(base_tokenizer), get_parser("json_list")
    policy = reference_policy(renderer, "test", _env(check_actions=["misreport"]), [task], parser)
    episode = asyncio.run(run_episode(_env(), task, policy, seed=0))
    assert episode.stop_reason is StopReason.INFRA_FAILURE
    assert episode.attribution is Attribution.ENVIRONMENT and not episode.gradient_eligible


def test_a_server_at_its_session_limit_makes_the_next_episode_wait(caplog):
    single = {"app": "tests.openenv_arith.server:app_single"}
    tasks = _env().sample_tasks(2, seed=0)

    async def play():
        first, second = _env(**single), _env(**single)
        await first.reset(tasks[0], 0)
        waiting = asyncio.create_task(second.reset(tasks[1], 0))
        await asyncio.sleep(1.0)
        assert not waiting.done()  # the server's one session is taken
        await first.close()
        messages = await asyncio.wait_for(waiting, 30)
        result = await second.step(Action(text=solve(tasks[1]), answer=""))
        await second.close()
        return messages, result

    with caplog.at_level(logging.WARNING, logger="tracerl"):
        messages, result = asyncio.run(play())
    assert messages[0]["content"] == problem(tasks[1]["reset"]["seed"])[0]
    assert result.info["openenv"]["reward"] == 1.0
    # the wait is inside the episode's clock: the run is told, once per server
    assert caplog.text.count("is at its limit of sessions (1): episodes wait") == 1
    assert "counts against rollout.budgets.wall_time_s" in caplog.text


def test_another_server_on_the_port_is_never_taken_for_ours(monkeypatch):
    """A server that holds the port tracerl picked (taken between the pick and the child's
    bind) is not adopted: an app's server binds a port itself; for a command, a process that
    ran before it and answers on its port took the port first."""
    from tracerl.envs.adapters.openenv import server

    class Anything(BaseHTTPRequestHandler):
        def do_GET(self):  # 200 and {} for /health, /metadata, /schema alike
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    other = ThreadingHTTPServer((server.HOST, 0), Anything)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    taken = other.server_address[1]
    monkeypatch.setattr(server, "free_port", lambda host=server.HOST: taken)
    command = [openenv_python(), "-m", "uvicorn", APP, "--port", "{port}"]
    try:
        env = _env(env_vars={"RACE": "app"})
        env.prepare()
        assert env.served.url != f"http://{server.HOST}:{taken}"
        assert env.version.endswith("/ArithEnvironment-1.0.0")
        with pytest.raises(ServerError, match=f"port {taken} is another process's"):
            make("openenv", command=command).prepare()
    finally:
        other.shutdown()
        other.server_close()
    monkeypatch.undo()  # a free port: the command's own server answers there
    task = _env().sample_tasks(1, seed=0)[0]
    result, b = _episode(make("openenv", command=command), task, solve(task))
    assert b.succeeded and result.info["openenv"]["reward"] == 1.0


TRAINER = """
import sys, time
from tracerl.envs import make
env = make("openenv", command=sys.argv[1:])
env.prepare()
print(env.served.server_pid, flush=True)
time.sleep(600)
"""


def test_a_trainer_killed_with_sigkill_leaves_no_server(tmp_path):
    """A command's server (which, unlike an app's, has no watch of its own on its starter)
    goes with a trainer killed outright, its children and its log folder with it."""
    from tracerl.engines.guard import group_alive

    root = Path(__file__).resolve().parents[2]
    command = [openenv_python(), "-m", "uvicorn", APP, "--port", "{port}"]
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER, *command],
        cwd=root,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root), "TMPDIR": str(tmp_path)},
    )
    try:
        server = int(trainer.stdout.readline())
        assert group_alive(server)
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(timeout=10)
        deadline = time.monotonic() + 30
        while (group_alive(server) or any(tmp_path.iterdir())) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not group_alive(server), "the OpenEnv server outlived its trainer"
        assert not list(tmp_path.iterdir()), "its log folder outlived it"
    finally:
        trainer.kill()


def test_tracerls_client_sees_what_openenvs_own_client_sees():
    env = _env()
    env.prepare()
    url = env.served.url
    theirs = textwrap.dedent(
        f"""
        import asyncio, json
        from openenv import GenericEnvClient
        async def main():
            out = []
            for seed, reply in ((5, "9"), (6, "12")):
                async with GenericEnvClient(base_url={url!r}) as client:
                    r = await client.reset(seed=seed)
                    s = await client.step({{"message": reply}})
                    out.append([r.observation, r.reward, r.done, s.observation, s.reward, s.done])
            print(json.dumps(out))
        asyncio.run(main())
        """
    )
    run = subprocess.run(
        [openenv_python(), "-c", theirs], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-2000:]

    async def ours():
        out = []
        for seed, reply in ((5, "9"), (6, "12")):
            session = Session(url)
            r = await session.reset(seed=seed)
            s = await session.step({"message": reply})
            await session.close()
            out.append([r["observation"], r["reward"], r["done"], *s.values()])
        return out

    assert asyncio.run(ours()) == json.loads(run.stdout)


def test_the_echo_environment_openenvs_template_writes(tmp_path, base_tokenizer):
    """An environment nobody here wrote: `openenv init` writes OpenEnv's echo environment;
    served as it is, its one text field is the action, its reward (0.1 per character) the
    reward; it is never done, so a reply's reward is scored only with single_step."""
    from tracerl.models.render import ChatRenderer

    made = subprocess.run(
        [openenv_python(), "-m", "openenv.cli", "init", "echo_env", "--output-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            **os.environ,
            "PATH": os.path.dirname(openenv_python()),
        },  # no `uv lock` on the network
    )
    assert (tmp_path / "echo_env" / "server" / "app.py").is_file(), made.stdout + made.stderr
    echo = {"app": "server.app:app", "cwd": str(tmp_path / "echo_env")}
    env = make("openenv", **echo)
    task = env.sample_tasks(1)[0]
    result, b = _episode(env, task, "hello")
    assert env.action_field == "message" and env.version.endswith("/EchoEnvironment-1.0.0")
    assert result.info["openenv"]["observation"]["echoed_message"] == "hello"
    assert result.info["openenv"]["done"] is False  # it never ends: the episode does
    # ended by tracerl's one-reply limit, not by the policy: undecided, never trained on
    assert not b.decided and not b.eligible and b.total == 0.0
    assert "single_step: true" in b.component("openenv_reward").evidence["why"]
    _, b = _episode(make("openenv", **echo, single_step=True), task, "hello")
    assert b.decided and b.total == pytest.approx(0.5) and b.attribution is Attribution.POLICY
    # check-env says why its reward check cannot pass, and passes with single_step
    renderer = ChatRenderer(base_tokenizer)
    for single, verdict in ((False, "undecided, never trained on"), (True, "episodes 2/2")):
        report = check_env(
            lambda s=single: make("openenv", **echo, check_actions=["hello there"], single_step=s),
            renderer=renderer,
            raise_on_failure=False,
        )
        assert report.ok is single and verdict in str(report), str(report)


def test_a_mistake_in_the_config_names_the_key():
    with pytest.raises(UserError, match="exactly one of base_url, app, command"):
        make("openenv")
    with pytest.raises(UserError, match="exactly one of"):
        make("openenv", app=APP, base_url="http://127.0.0.1:1")
    with pytest.raises(UserError, match="app: module:attribute"):
        make("openenv", app="tests/openenv_arith/server.py")
    with pytest.raises(UserError, match=r"tasks\.train: a list of reset arguments"):
        make("openenv", app=APP, tasks={"train": {"seed": 1}})
    with pytest.raises(UserError, match=r"no field 'msg'; its fields: message, metadata"):
        _env(action="msg").prepare()
    with pytest.raises(ValueError, match="unknown split 'test'"):
        _env().sample_tasks(1, split="test")
    explicit = make("openenv", app=APP, tasks={"train": [{"seed": 1}], "dev": [{"seed": 2}]})
    assert explicit.splits == ("train", "dev")
    assert explicit.sample_tasks(5, split="dev") == [
        {"id": "openenv-dev-0", "split": "dev", "reset": {"seed": 2}}
    ]
