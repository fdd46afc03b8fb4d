"""Sub-agents with a reward of their own (``subagent_reward``): the grade is recorded in the
parent's receipt, a graded child trains with an advantage against its peers (the children
at the same place in the group's other episodes), the parent keeps its own advantage and
counts once, a grading that fails leaves the child out, and without a grader (or with
``own_reward: false``) every child trains with its parent's advantage."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from tests.unit.test_subagents import CHILD, ROOT, ROOT_ID, Archive, scripted
from tracerl.rollout.budget import Budgets, RolloutConfig
from tracerl.rollout.context import SubagentConfig
from tracerl.rollout.runner import run_episode
from tracerl.train.grpo import GRPOConfig, episode_advantages, has_signal, update_on_groups
from tracerl.types import RewardBreakdown


class Graded(Archive):
    """Grades a child by the numbers the task's pages really give."""

    def subagent_reward(self, task, subtask, answer):
        return 1.0 if answer == "10 20" else 0.0


class Crashing(Archive):
    def subagent_reward(self, task, subtask, answer):
        raise KeyError("gold")


class Wordy(Archive):
    def subagent_reward(self, task, subtask, answer):
        return "good"


def play(tiny, env, child_answer="10 20", sub=None, reward=1.0):
    cfg = RolloutConfig(
        budgets=Budgets(steps=4),
        reserve=None,
        subagents=sub or SubagentConfig(),
        max_turn_tokens=48,
    )
    child = [*CHILD[:2], child_answer]
    policy = scripted(tiny, root=ROOT, child=child)
    ep = asyncio.run(run_episode(env, {"id": "t"}, policy, cfg, seed=0, episode_id=ROOT_ID))
    return dataclasses.replace(ep, reward=RewardBreakdown.scalar(reward, ep.attribution))


class _Learner:
    def update(self, rows, advantages, *, lr_scale=1.0, weights=None):
        self.rows, self.advantages, self.weights = rows, advantages, weights
        return {}


def test_the_childs_grade_is_recorded_in_the_parents_receipt(tiny):
    (rec,) = play(tiny, Graded()).receipt.children
    assert rec["reward"] == 1.0 and rec["answer"] == "10 20"
    (rec,) = play(tiny, Graded(), child_answer="10 30").receipt.children
    assert rec["reward"] == 0.0
    for env, sub in ((Archive(), None), (Graded(), SubagentConfig(own_reward=False))):
        (rec,) = play(tiny, env, sub=sub).receipt.children
        assert "reward" not in rec  # nobody graded it: the parent's advantage
    for env, why in ((Crashing(), "KeyError"), (Wordy(), "not a number")):
        (rec,) = play(tiny, env).receipt.children
        assert rec["reward"] is None and why in rec["reward_error"]


def test_a_graded_child_trains_against_its_peers_and_the_parent_keeps_its_own(tiny):
    # parents rewarded 1, 0, 1; children graded 1, 0, 0 (the third child answered wrong)
    group = [
        play(tiny, Graded(), "10 20", reward=1.0),
        play(tiny, Graded(), "10 30", reward=0.0),
        play(tiny, Graded(), "11 20", reward=1.0),
    ]
    cfg = GRPOConfig(group_size=3)
    _, _, parent = episode_advantages([group], cfg)
    learner = _Learner()
    metrics = update_on_groups([group], learner, cfg)
    assert [t.agent for t in learner.rows] == ["", "d0"] * 3
    children_alone = episode_advantages(
        [
            [
                dataclasses.replace(e, reward=RewardBreakdown.scalar(r, e.attribution))
                for e, r in zip(group, (1.0, 0.0, 0.0), strict=True)
            ]
        ],
        cfg,
    )[2]
    assert learner.advantages[0::2] == pytest.approx(parent)  # the parents: unchanged
    assert learner.advantages[1::2] == pytest.approx(children_alone)  # the children: own
    assert learner.advantages[5] < 0 < learner.advantages[4]  # right parent, wrong child
    assert learner.weights == pytest.approx([0.5] * 6)  # each episode still weighs one
    assert metrics["train/subagent_reward_mean"] == pytest.approx(1 / 3)
    assert metrics["train/subagent_reward_errors"] == 0.0


def test_without_a_grade_children_take_the_parents_advantage(tiny):
    group = [play(tiny, Archive(), reward=r) for r in (1.0, 0.0)]
    learner = _Learner()
    metrics = update_on_groups([group], learner, GRPOConfig(group_size=2))
    a = learner.advantages
    assert a[0] == a[1] > 0 > a[2] == a[3]  # parent and child of each episode alike
    assert "train/subagent_reward_mean" not in metrics


def test_a_failed_grading_leaves_the_child_out_and_the_parent_in(tiny):
    group = [play(tiny, Crashing(), reward=r) for r in (1.0, 0.0)]
    learner = _Learner()
    metrics = update_on_groups([group], learner, GRPOConfig(group_size=2))
    assert [t.agent for t in learner.rows] == ["", ""]  # the evaluator's: no tokens train
    assert metrics["train/subagent_reward_errors"] == 2.0


def test_a_group_whose_parents_tie_still_has_signal_in_its_children(tiny):
    tied = [play(tiny, Graded(), ans, reward=1.0) for ans in ("10 20", "10 30")]
    assert has_signal(tied, GRPOConfig(group_size=2))
    plain = [play(tiny, Archive(), ans, reward=1.0) for ans in ("10 20", "10 30")]
    assert not has_signal(plain, GRPOConfig(group_size=2))
