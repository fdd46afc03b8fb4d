"""Turn-level credit reaches the learner: each turn's advantage on that turn's policy
tokens only; the outcome estimator per turn is exactly today's per-episode update; a step
trains with `credit: step_groups` and `turn_returns`."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch

from tests.scripts import scripted_policy
from tracerl.envs import make
from tracerl.rollout.budget import Budgets, RolloutConfig
from tracerl.rollout.runner import run_episode
from tracerl.train.grpo import GRPOConfig, update_on_groups
from tracerl.train.learner import Learner, LearnerConfig
from tracerl.train.turn_credit import episode_turns, turn_level_advantages
from tracerl.types import RewardBreakdown

CFG = RolloutConfig(budgets=Budgets(steps=6, tool_calls=8, write_actions=2), reserve=None)


@pytest.fixture(scope="module")
def group(tiny):
    """One refund task played by the four scripted plans (good, bad tool, bad args,
    garbled): episodes of different lengths from one prompt."""
    task = make("refund_desk").sample_tasks(1, seed=3)[0]
    policy = scripted_policy(tiny.renderer, [task])
    episodes = [
        asyncio.run(
            run_episode(
                make("refund_desk"), task, policy, CFG, seed=0, episode_id=f"{task['id']}:s0:g{g}"
            )
        )
        for g in range(4)
    ]
    return episodes, [1.0, 0.0, 0.5, 0.0]


def test_turns_are_the_policy_segments_and_share_a_state_exactly_when_histories_match(group):
    episodes, _ = group
    turns = [episode_turns(e) for e in episodes]
    assert [len(t) for t in turns] == [len([s for s in e.steps if "action" in s]) for e in episodes]
    # every plan's first turn is the same lookup, from the same prompt: the second turns
    # act from one state; after the plans' second turns differ, so do their states
    assert len({t[0]["state"] for t in turns}) == 1
    assert len({t[1]["state"] for t in turns}) == 1
    assert turns[0][2]["state"] != turns[1][2]["state"]


def test_each_turns_advantage_sits_on_its_policy_tokens_only(group):
    episodes, rewards = group
    group_B = torch.zeros(4, dtype=torch.long)
    per_token = turn_level_advantages(episodes, rewards, group_B, [True] * 4, "turn_returns")
    for e, rows in zip(episodes, per_token, strict=True):
        for t, row in zip(e.trajectories, rows, strict=True):
            assert len(row) == len(t)
            assert all(a == 0.0 for a, m in zip(row, t.loss_mask, strict=True) if not m)
    # the outcome estimator per turn is the episode's advantage on each policy token
    outcome = turn_level_advantages(episodes, rewards, group_B, [True] * 4, "outcome", base="rloo")
    expected = [1.0 - 0.5 / 3, -1.5 / 3, 0.5 - 1.0 / 3, -1.5 / 3]
    for e, rows, a in zip(episodes, outcome, expected, strict=True):
        for t, row in zip(e.trajectories, rows, strict=True):
            vals = {round(v, 6) for v, m in zip(row, t.loss_mask, strict=True) if m}
            assert vals == {round(a, 6)}


def test_per_token_outcome_credit_is_exactly_the_per_episode_update(group, tiny):
    episodes, rewards = group
    trajs = [t for e in episodes for t in e.trajectories]
    group_B = torch.zeros(4, dtype=torch.long)
    scalar = [
        a for e, a in zip(episodes, [5 / 6, -0.5, 1 / 6, -0.5], strict=True) for _ in e.trajectories
    ]
    per_token = turn_level_advantages(
        episodes, rewards, group_B, [True] * 4, "outcome", base="rloo"
    )
    tokens = [row for rows in per_token for row in rows]

    def update(advs):
        m = copy.deepcopy(tiny.model)
        return Learner(m, LearnerConfig(lr=1e-3, micro_batch_tokens=10_000)).update(trajs, advs)

    a, b = update(scalar), update(tokens)
    assert a["train/loss"] == pytest.approx(b["train/loss"], abs=1e-6)
    assert a["train/grad_norm"] == pytest.approx(b["train/grad_norm"], rel=1e-4)


@pytest.mark.parametrize("credit", ["turn_returns", "step_groups"])
def test_a_step_trains_with_turn_level_credit(group, tiny, credit):
    episodes, rewards = group
    for e, r in zip(episodes, rewards, strict=True):
        e.reward = RewardBreakdown.scalar(r, e.attribution)
    learner = Learner(copy.deepcopy(tiny.model), LearnerConfig(lr=1e-3))
    metrics = update_on_groups([episodes], learner, GRPOConfig(group_size=4, credit=credit))
    assert metrics["train/policy_tokens"] > 0 and metrics["train/grad_norm"] > 0
    assert metrics["train/zero_signal_groups"] == 0.0
