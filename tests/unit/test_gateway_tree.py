"""Sub-agents and parallel sessions of one episode through the gateway: a planner and two
workers running at once (`tests.harnesses:planner_and_workers`, three sessions named by
the episode's key and ``KEY/NAME``) make one episode, all three sessions' policy tokens
train under that episode's one advantage, and the group baseline counts it once."""

from __future__ import annotations

import dataclasses

import pytest

from tests.unit.test_gateway import CALL, CFG, scripted, via_gateway
from tests.unit.test_sample_weighting import _Learner
from tracerl.gateway import Gateway
from tracerl.gateway.tree import MAX_CHILDREN
from tracerl.models import load
from tracerl.rollout.budget import Budgets
from tracerl.train.grpo import GRPOConfig, episode_advantages, update_on_groups
from tracerl.types import Attribution, RewardBreakdown, Source, StopReason

TURNS = {0: CALL, 1: "The sum is 5."}


@pytest.fixture(scope="module")
def bundle():
    return load("tiny-random")


def planner(bundle, **kw):
    return via_gateway("tests.harnesses:planner_and_workers", scripted(bundle, TURNS), **kw)


def test_a_planner_and_two_parallel_workers_are_one_episode(bundle):
    episode = planner(bundle)
    assert episode.stop_reason is StopReason.ANSWERED, episode.receipt.error
    assert episode.attribution is Attribution.POLICY and episode.gradient_eligible
    by_agent = {}
    for t in episode.trajectories:
        by_agent.setdefault(t.agent, []).append(t)
    assert sorted(by_agent) == ["", "worker1", "worker2"]
    assert [t.sample_index for t in episode.trajectories] == list(range(len(episode.trajectories)))
    # each worker ran its own conversation: its tool call and the tool's result, no break
    for name in ("worker1", "worker2"):
        [t] = by_agent[name]
        assert t.episode_id == episode.receipt.episode_id
        assert "".join(s.text for s in t.segments if s.source is Source.ENVIRONMENT) == "5"
        assert len(t.policy_segments()) == 2
    children = {c["agent"]: c for c in episode.receipt.children}
    assert set(children) == {"worker1", "worker2"}
    assert all(c["requests"] == 2 and c["history_breaks"] == 0 for c in children.values())
    assert all(c["stop_reason"] == "answered" for c in children.values())
    assert episode.receipt.agent["history_breaks"] == []  # the planner's own: unbroken
    # the episode pays for its workers: the root's ledger counts every session's tokens
    own = sum(len(s.token_ids) for t in by_agent[""] for s in t.policy_segments())
    workers = sum(c["sampled_tokens"] for c in children.values())
    assert episode.receipt.ledger["used"]["sampled_tokens"] == own + workers > own


def test_the_tree_trains_under_one_advantage_counted_once(bundle):
    """Hand-checked: two episodes of a group (rewards 1 and 0). The baseline is over two
    episodes, not over their samples; every sample of an episode (its planner's and both
    workers') gets that episode's advantage."""
    a, b = planner(bundle), planner(bundle, seed=8)
    a = dataclasses.replace(a, reward=RewardBreakdown.scalar(1.0, a.attribution))
    b = dataclasses.replace(b, reward=RewardBreakdown.scalar(0.0, b.attribution))
    cfg = GRPOConfig(group_size=2)
    _, _, adv = episode_advantages([[a, b]], cfg)
    # GRPO: (r - mean) / std over the two episodes: +-1/sqrt(2) with the unbiased std
    assert adv == pytest.approx([0.7071, -0.7071], abs=1e-3)
    learner = _Learner()
    update_on_groups([[a, b]], learner, cfg)
    n_a, n_b = len(a.trajectories), len(b.trajectories)
    assert n_a == n_b == 3
    assert learner.advantages == pytest.approx([adv[0]] * n_a + [adv[1]] * n_b)
    # the episode's weight is split over its samples: it counts once, not three times
    assert learner.weights == pytest.approx([1 / 3] * 6)
    trained = {t.agent for t in learner.rows}
    assert trained == {"", "worker1", "worker2"}


def test_the_trees_token_budget_is_shared(bundle):
    """``budgets.sampled_tokens`` bounds the whole tree: workers spend the episode's."""
    tight = CFG.model_copy(update={"budgets": Budgets(steps=4, sampled_tokens=60)})
    episode = planner(bundle, cfg=tight)
    used = episode.receipt.ledger["used"]["sampled_tokens"]
    assert used <= 60
    assert episode.stop_reason in (StopReason.MAX_TOKENS, StopReason.AGENT_ERROR)
    stops = {c["stop_reason"] for c in episode.receipt.children} | {episode.stop_reason.value}
    assert "max_tokens" in stops


def test_child_session_names_are_checked_and_bounded(bundle):
    import asyncio

    from tracerl.gateway.chat import GatewayError
    from tracerl.gateway.session import GatewaySession

    policy = scripted(bundle, TURNS)
    session = GatewaySession("trs-x", policy, CFG, seed=0, episode_id="e")
    with pytest.raises(GatewayError, match="letters, digits"):
        session.delegation.open("a b")
    for k in range(MAX_CHILDREN):
        session.delegation.open(f"w{k}")
    with pytest.raises(GatewayError, match="at most"):
        session.delegation.open("one-more")
    with pytest.raises(GatewayError, match="cannot open children"):
        session.delegation.open("w0").delegation.open("deeper")
    gateway = Gateway("m")
    gateway.add(session)
    assert gateway.find({}, {}, "trs-x/w3") is session.delegation.sessions["w3"]
    gateway.remove("trs-x")
    assert gateway.sessions == {}
    asyncio.run(asyncio.sleep(0))


def test_a_tree_episode_replays_exactly_and_notices_a_changed_child(bundle):
    import asyncio

    from tracerl.gateway.replay import replay_exact

    episode = planner(bundle)
    report = asyncio.run(replay_exact(episode.trajectories, renderer=bundle.renderer))
    assert report.ok, report.first_difference
    # a worker's recorded tool result edited: its conversation no longer replays
    trajectories = list(episode.trajectories)
    k = next(i for i, t in enumerate(trajectories) if t.agent == "worker2")
    steps = [dict(s) for s in trajectories[k].steps]
    steps[0]["response"] = {**steps[0]["response"], "content": "tampered"}
    trajectories[k] = dataclasses.replace(trajectories[k], steps=tuple(steps), _cache={})
    report = asyncio.run(replay_exact(trajectories, renderer=bundle.renderer))
    assert not report.ok and "child session worker2" in report.first_difference


def test_a_tree_episode_replays_live_conversation_by_conversation(bundle):
    import asyncio

    from tracerl.gateway.replay import replay_live

    episode = planner(bundle)
    report = asyncio.run(replay_live(episode.trajectories))
    where = {d.step: d.status for d in report.steps}
    assert where == {0: "same", 1: "same", "worker1:0": "same", "worker1:1": "same",
                     "worker2:0": "same", "worker2:1": "same"}, report.steps  # fmt: skip
