"""A verifiers (0.4) environment, trained as it ships: verifiers runs in its own virtual
environment (``make verifiers``), its harness plays each episode, every model call goes
through tracerl's gateway. What a user must be able to trust:

* the policy tokens tracerl records are exactly the tokens the sampler returned, and the text
  verifiers' harness saw is what they decode to;
* the reward tracerl trains on is verifiers' own rubric on that completion: the same number
  verifiers computed during its rollout, and the same again when verifiers scores the
  recorded text by itself;
* a rubric that raises is the evaluator's failure, a task set-up that raises or a dead worker
  the environment's, never a signal;
* `tracerl check-env` passes and the example config trains a tiny model for two steps.

The environments (examples/verifiers_envs/vf_last_digit, tests/verifiers_envs/vf_faulty) are
written against verifiers' public API the way `vf init` scaffolds one; Prime's hub, where
such environments are published, is not reachable from here.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

import pytest

from tracerl.envs import make
from tracerl.envs.adapters.verifiers import AGENT, prompt_messages, rubric_score
from tracerl.envs.adapters.verifiers.process import running_worker, verifiers_python
from tracerl.envs.parsers import get_parser
from tracerl.errors import UserError
from tracerl.rewards.resolve import resolve_reward
from tracerl.rollout.budget import Budgets, RolloutConfig
from tracerl.rollout.sampler import SampleRequest, ScriptedSampler
from tracerl.types import Attribution, Source, StopReason

try:
    verifiers_python(None)
except UserError as e:  # make test installs it (and requires it); a bare checkout may not
    if os.environ.get("TRACERL_REQUIRE_VERIFIERS"):
        raise
    pytest.skip(f"verifiers is not installed: {e}", allow_module_level=True)

from tests.adapters import trains_two_steps
from tests.ownpkg import tracerl
from tracerl.config.loading import load_config
from tracerl.gateway import AgentBackend, Gateway
from tracerl.models import load
from tracerl.rollout import BatchedHFSampler
from tracerl.rollout.runner import Policy

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "verifiers_last_digit.yaml"
EXAMPLES = str(ROOT / "examples" / "verifiers_envs")
FAULTY = str(ROOT / "tests" / "verifiers_envs")
CFG = RolloutConfig(budgets=Budgets(steps=2), reserve=None, max_turn_tokens=4)


@pytest.fixture(scope="module")
def bundle():
    return load("tiny-chars")


def last_digit(**kw):
    return make(
        "verifiers",
        taskset="vf-last-digit",
        taskset_config={"num_tasks": 40},
        path=[EXAMPLES],
        **kw,
    )


class Recording:
    """A sampler that keeps what it returned to each episode, turn by turn."""

    def __init__(self, inner) -> None:
        self.inner, self.policy_version = inner, 0
        self.sampled: dict[str, list[list[int]]] = {}

    async def sample(self, request: SampleRequest):
        result = await self.inner.sample(request)
        self.sampled.setdefault(request.episode_id, []).append(list(result.token_ids))
        return result


def episodes(factory, tasks, sampler, bundle, seeds=(0, 1), cfg=CFG):
    policy = Policy(sampler, bundle.renderer, get_parser("json_list"), bundle.spec)

    async def go():
        with Gateway(policy.model_id) as gateway:
            backend = AgentBackend(AGENT, gateway, timeout_s=120)
            runs = [
                backend.run_episode(
                    factory, t, policy, cfg, seed=s, episode_id=f"{t['id']}:s{s}:g0"
                )
                for t in tasks
                for s in seeds
            ]
            return await asyncio.gather(*runs)

    return asyncio.run(go())


def scripted(bundle, tasks=()):
    """Replies that score differently: seed 0 the right digit, seed 1 a wrong one, seed 2
    not a digit."""
    gold = {t["id"]: t["data"].get("answer", "0") for t in tasks}

    def reply(req: SampleRequest) -> str:
        task_id, seed = req.episode_id.split(":")[:2]
        right = gold.get(task_id, "0")
        return {"s0": right, "s1": str((int(right) + 1) % 10)}.get(seed, "x!")

    return ScriptedSampler.from_texts(bundle.renderer, reply)


def policy_text(episode, bundle) -> str:
    segments = episode.trajectories[-1].policy_segments()
    ids = [i for s in segments for i in s.token_ids if i not in bundle.renderer.stop_token_ids]
    return bundle.renderer.tokenizer.decode(ids)


def test_recorded_tokens_are_the_sampled_ones_and_the_reward_is_verifiers_own(bundle):
    env = last_digit()
    tasks = env.sample_tasks(4, seed=3)
    assert tasks[0]["worker"] == env.key and tasks[0]["data"]["system_prompt"]
    sampler = Recording(scripted(bundle, tasks))
    eps = episodes(last_digit, tasks, sampler, bundle, seeds=(0, 1, 2))
    reward = resolve_reward(None, None, env)
    worker = running_worker(env.key)
    seen = []
    for ep in eps:
        assert ep.stop_reason is StopReason.ANSWERED, ep.receipt.error
        assert ep.attribution is Attribution.POLICY and ep.gradient_eligible
        # exactly the sampled tokens, and nothing else with loss
        traj = ep.trajectories[-1]
        policy_ids = [list(s.token_ids) for s in traj.policy_segments()]
        assert policy_ids == sampler.sampled[ep.episode_id]
        loss_ids = [i for i, m in zip(traj.token_ids, traj.loss_mask, strict=True) if m]
        assert loss_ids == [i for turn in policy_ids for i in turn]
        assert {Source.PROMPT, Source.POLICY, Source.TEMPLATE} >= set(traj.sources)
        # the text verifiers' harness received is what those tokens decode to
        returned = ep.receipt.agent["returned"]
        text = policy_text(ep, bundle)
        assert returned["messages"][-1] == {"role": "assistant", "content": text}
        # the reward tracerl trains on is the rubric's number from verifiers' rollout
        score = reward(ep)
        assert score.error is None and score.total == pytest.approx(returned["reward"])
        # ... and verifiers scoring the recorded text by itself says the same
        task = next(t for t in tasks if ep.episode_id.startswith(t["id"]))
        messages = [*prompt_messages(task["data"]), {"role": "assistant", "content": text}]
        again = worker.request(
            "score", split=task["split"], index=task["index"], key=task["key"], messages=messages
        ).result(60)
        assert again["rewards"] == returned["rewards"] and again["reward"] == returned["reward"]
        seen.append(returned["reward"])
        assert returned["reward"] == (1.0 if text == task["data"]["answer"] else 0.0)
    assert len(eps) == 12 and set(seen) == {0.0, 1.0}
    assert ep.receipt.env["version"].startswith("1.0/verifiers-0.4.0/")


def test_a_real_samplers_tokens_are_recorded_verbatim(bundle):
    env = last_digit()
    tasks, reward = env.sample_tasks(2, seed=5), resolve_reward(None, None, env)
    sampler = Recording(BatchedHFSampler(bundle.model, temperature=1.0, seed=0))
    eps = episodes(last_digit, tasks, sampler, bundle)
    for ep in eps:
        assert ep.attribution is Attribution.POLICY, ep.receipt.error
        traj = ep.trajectories[-1]
        assert [list(s.token_ids) for s in traj.policy_segments()] == sampler.sampled[ep.episode_id]
        # however it ended (answered, or cut by the token limit), verifiers saw the reply
        # those tokens decode to, and its rubric's number is the reward
        returned = ep.receipt.agent["returned"]
        assert returned["messages"][-1]["content"] == policy_text(ep, bundle)
        assert reward(ep).total == pytest.approx(returned["reward"])
    assert {StopReason.ANSWERED, StopReason.MAX_TOKENS} & {e.stop_reason for e in eps}


def test_a_taskset_with_tools_runs_them_and_their_output_carries_no_loss(bundle):
    """vf-lookup serves a `lookup` tool over MCP (verifiers starts the server); the model
    calls it, then answers with what it returned."""

    def factory():
        return make("verifiers", taskset="vf-lookup", path=[FAULTY], heldout=0.25)

    tasks = factory().sample_tasks(2)
    names = {t["id"]: t["data"]["name"] for t in tasks}

    def turn(req: SampleRequest) -> str:
        name = names[req.episode_id.split(":")[0]]
        if req.turn == 0:
            call = [{"name": "codes_lookup", "arguments": {"name": name}}]
            return f"<tool_call>{json.dumps(call)}</tool_call>"
        return {"alpha": "7", "bravo": "3", "charlie": "9", "delta": "1"}[name]

    sampler = Recording(ScriptedSampler.from_texts(bundle.renderer, turn))
    cfg = RolloutConfig(budgets=Budgets(steps=3), reserve=None, max_turn_tokens=96)
    for ep in episodes(factory, tasks, sampler, bundle, seeds=(0,), cfg=cfg):
        assert ep.stop_reason is StopReason.ANSWERED, ep.receipt.error
        assert ep.attribution is Attribution.POLICY
        traj = ep.trajectories[-1]
        assert [list(s.token_ids) for s in traj.policy_segments()] == sampler.sampled[ep.episode_id]
        returned = ep.receipt.agent["returned"]
        code = returned["messages"][-1]["content"]
        # the tool's result reached the model as environment tokens, without loss
        env_segments = [s for s in traj.segments if s.source is Source.ENVIRONMENT]
        assert env_segments and code in "".join(s.text for s in env_segments)
        assert not any(
            traj.loss_mask[i] for i, s in enumerate(traj.sources) if s is Source.ENVIRONMENT
        )
        assert ep.steps[0]["calls"][0]["action"]["tool"] == "codes_lookup"
        assert returned["reward"] == 1.0 and resolve_reward(None, None, factory())(ep).total == 1.0


def faulty(fail: str):
    def factory():
        return make(
            "verifiers",
            taskset="vf-faulty",
            taskset_config={"task": {"fail": fail}},
            path=[FAULTY],
        )

    return factory


def test_a_crashing_rubric_is_the_evaluators_and_a_failing_setup_the_environments(bundle):
    rubric = faulty("rubric")
    env = rubric()
    tasks = env.sample_tasks(1)
    [ep, _] = episodes(rubric, tasks, scripted(bundle), bundle)
    assert ep.stop_reason is StopReason.ANSWERED  # the episode itself went fine
    score = resolve_reward(None, None, env)(ep)
    assert score.error is not None and "divided by zero" in score.error
    assert not score.decided  # never a 0: the evaluator's, not trained on

    setup = faulty("setup")
    [ep, _] = episodes(setup, setup().sample_tasks(1), scripted(bundle), bundle)
    assert ep.attribution is Attribution.ENVIRONMENT and not ep.gradient_eligible
    assert "database is down" in ep.receipt.error

    # verifiers' own deadline for the agent expires: a stop it scores, never the policy's
    deadline = faulty("deadline")
    [ep, _] = episodes(deadline, deadline().sample_tasks(1), scripted(bundle), bundle)
    assert ep.attribution is Attribution.ENVIRONMENT and not ep.gradient_eligible
    assert "deadline" in ep.receipt.error


def test_scoring_without_the_tasks_runtime_leaves_rewards_unscored_not_dropped():
    """verifiers skips a reward that needs the task's runtime when it scores offline (a
    native episode): the total would silently lack it, so the episode is undecided."""
    env = faulty("none")()
    task = env.sample_tasks(1)[0]
    reply = {"role": "assistant", "content": task["data"]["answer"]}
    result = (
        running_worker(env.key)
        .request(
            "score",
            split=task["split"],
            index=task["index"],
            key=task["key"],
            messages=[*prompt_messages(task["data"]), reply],
        )
        .result(60)
    )
    assert result["unscored"] == ["in_the_box"] and result["reward"] is None
    with pytest.raises(RuntimeError, match="unscored: in_the_box"):
        rubric_score(result)


def test_a_dead_worker_is_an_outage_and_the_next_episode_starts_a_new_one(bundle):
    factory = faulty("none")
    env = factory()
    tasks = env.sample_tasks(1)
    worker = running_worker(env.key)
    os.kill(worker.proc.pid, signal.SIGKILL)
    worker.proc.wait()
    # prepare() (before the episode's clock) starts a new worker: the episode is played
    [ep, _] = episodes(factory, tasks, scripted(bundle), bundle)
    assert ep.attribution is Attribution.POLICY, ep.receipt.error
    assert running_worker(env.key).proc.pid != worker.proc.pid
    # one that dies during an episode fails it as the environment's
    killer = running_worker(env.key)

    class KillsTheWorker(Recording):
        async def sample(self, request):
            os.kill(killer.proc.pid, signal.SIGKILL)
            await asyncio.sleep(1.0)
            return await super().sample(request)

    [ep] = episodes(factory, tasks, KillsTheWorker(scripted(bundle)), bundle, seeds=(0,))
    assert ep.attribution is Attribution.ENVIRONMENT and not ep.gradient_eligible
    assert "worker" in ep.receipt.error


def test_check_env_passes_on_a_verifiers_environment(tmp_path):
    result = tracerl("check-env", "--config", str(CONFIG), cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "splits: train, heldout" in result.stdout and "FAIL" not in result.stdout
    assert "reward: attribution, rubric; scripted episodes 2/2" in result.stdout


def test_the_example_config_trains_a_tiny_model_for_two_steps(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the config's path is relative to the checkout, as documented
    overrides = [f"out_dir={tmp_path}", "trainer.steps=2", "env.eval_tasks=4"]
    cfg = load_config(CONFIG, overrides)
    assert cfg.agent is not None and cfg.agent.entry == AGENT  # the environment brings it
    trajs = trains_two_steps(cfg, "rubric")
    assert all(t.receipt["agent"]["entry"] == AGENT for t in trajs)
    assert all(t.receipt["env"]["version"].startswith("1.0/verifiers-0.4.0/") for t in trajs)
    owners = {t.receipt["attribution"] for t in trajs}
    assert owners == {"policy"}, owners
