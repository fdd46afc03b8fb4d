"""Episodes of several samples (a compaction, a template that strips reasoning, a
sub-agent) in training: each counts once in its group's baseline, every sample gets the
episode's advantage on its own policy tokens, and ``trainer.sample_weighting: episode``
makes an episode of five samples weigh what an episode of one sample weighs — in the loss
and in the gradient, under every aggregation, across micro-batches."""

from __future__ import annotations

import asyncio
import copy
import dataclasses

import pytest
import torch

from tracerl.algos import ClipConfig
from tracerl.algos.losses import aggregate
from tracerl.envs import get_parser, make
from tracerl.rollout import HFSampler
from tracerl.rollout.budget import Budgets, RolloutConfig
from tracerl.rollout.runner import Policy, run_episode
from tracerl.train.grpo import GRPOConfig, episode_advantages, row_shares, update_on_groups
from tracerl.train.learner import Learner, LearnerConfig
from tracerl.types import RewardBreakdown

AGGS = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
CFG = RolloutConfig(budgets=Budgets(steps=1), max_turn_tokens=6, reserve=None)


def test_the_aggregations_weigh_sequences_as_computed_by_hand():
    # per-token losses of three sequences: the first two are one episode's two samples
    loss = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0], [4.0, 6.0, 8.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    w = torch.tensor([0.5, 0.5, 1.0])
    want = {
        # sum(w l) / sum(w) over tokens: (0.5*3 + 0.5*3 + 18) / (0.5*2 + 0.5*1 + 3)
        "token-mean": (21.0 / 4.5, [[0.5 / 4.5] * 2 + [0], [0.5 / 4.5, 0, 0], [1 / 4.5] * 3]),
        # sum(w_s sum_s) / sum(w_s): (0.5*3 + 0.5*3 + 18) / 2
        "seq-mean-token-sum": (10.5, [[0.25, 0.25, 0], [0.25, 0, 0], [0.5] * 3]),
        # (0.5*1.5 + 0.5*3 + 6) / 2
        "seq-mean-token-mean": (4.125, [[0.125, 0.125, 0], [0.25, 0, 0], [0.5 / 3] * 3]),
        # seq-mean-token-sum over a constant 3
        "seq-mean-token-sum-norm": (3.5, [[0.25 / 3] * 2 + [0], [0.25 / 3, 0, 0], [0.5 / 3] * 3]),
    }
    for mode, (value, grad) in want.items():
        loss.grad = None
        out = aggregate(loss, mask, mode, weights_B=w)
        out.backward()
        assert out.item() == pytest.approx(value), mode
        assert torch.allclose(loss.grad, torch.tensor(grad)), (mode, loss.grad)
        # without weights: today's aggregation, unchanged
        assert aggregate(loss, mask, mode).item() == pytest.approx(
            aggregate(loss, mask, mode, weights_B=torch.ones(3)).item()
        )


def _samples(tiny, model, n):
    policy = Policy(HFSampler(model, temperature=1.0), tiny.renderer, get_parser("json_list"), "t")
    task = make("refund_desk").sample_tasks(1)[0]
    return [
        asyncio.run(run_episode(make("refund_desk"), task, policy, CFG, seed=s)).trajectories[0]
        for s in range(n)
    ]


def _grads(model, trajs, advs, agg, weights=None, micro=10**6):
    m = copy.deepcopy(model)
    cfg = LearnerConfig(
        lr=1e-12, micro_batch_tokens=micro, max_grad_norm=1e9, clip=ClipConfig(agg=agg)
    )
    out = Learner(m, cfg).update(trajs, advs, weights=weights)
    return out, torch.cat([p.grad.flatten() for p in m.parameters() if p.grad is not None])


@pytest.mark.parametrize("agg", AGGS)
def test_an_episode_of_five_samples_weighs_what_an_episode_of_one_weighs(tiny, agg):
    model = copy.deepcopy(tiny.model)
    x, y = _samples(tiny, model, 2)
    # episode A: five samples (here five copies of x, so the answer is known); episode B: y
    five = [dataclasses.replace(x, sample_index=i) for i in range(5)]
    reference, g_ref = _grads(model, [x, y], [1.0, -0.25], agg)  # one sample each
    for micro in (10**6, 1):  # one micro-batch, then a row per micro-batch
        out, g = _grads(model, [*five, y], [1.0] * 5 + [-0.25], agg, [0.2] * 5 + [1.0], micro)
        assert out["train/loss"] == pytest.approx(reference["train/loss"], rel=1e-5)
        assert abs(reference["train/loss"]) > 1e-3  # not a cancellation
        assert ((g - g_ref).norm() / g_ref.norm()).item() < 1e-4, (agg, micro)
    if agg != "token-mean":  # per sample, A would weigh five times what B weighs
        _, g_sample = _grads(model, [*five, y], [1.0] * 5 + [-0.25], agg)
        assert ((g_sample - g_ref).norm() / g_ref.norm()).item() > 0.1


class _Learner:
    def update(self, rows, advantages, *, lr_scale=1.0, weights=None):
        self.rows, self.advantages, self.weights = rows, advantages, weights
        return {}


def test_a_group_counts_each_episode_once_whatever_its_samples(tiny):
    model = copy.deepcopy(tiny.model)
    policy = Policy(HFSampler(model, temperature=1.0), tiny.renderer, get_parser("json_list"), "t")
    task = make("refund_desk").sample_tasks(1)[0]
    base = asyncio.run(run_episode(make("refund_desk"), task, policy, CFG, seed=0))
    x = base.trajectories[0]

    def episode(n, reward):
        samples = [dataclasses.replace(x, sample_index=i) for i in range(n)]
        return dataclasses.replace(
            base, trajectories=samples, reward=RewardBreakdown.scalar(reward, base.attribution)
        )

    many = [episode(5, 1.0), episode(1, 0.0), episode(3, 0.0), episode(1, 1.0)]
    single = [episode(1, 1.0), episode(1, 0.0), episode(1, 0.0), episode(1, 1.0)]
    cfg = GRPOConfig(group_size=4)
    _, _, adv_many = episode_advantages([many], cfg)
    _, _, adv_single = episode_advantages([single], cfg)
    assert adv_many == pytest.approx(adv_single)  # the baseline: four episodes, not ten
    assert adv_many[0] > 0 > adv_many[1]

    learner = _Learner()
    update_on_groups([many], learner, cfg)
    assert len(learner.rows) == 10
    assert learner.advantages == pytest.approx(
        [adv_many[0]] * 5 + [adv_many[1]] + [adv_many[2]] * 3 + [adv_many[3]]
    )
    assert learner.weights == pytest.approx([0.2] * 5 + [1.0] + [1 / 3] * 3 + [1.0])
    assert row_shares(many[0], "sample") == [1.0] * 5
    update_on_groups([many], learner, dataclasses.replace(cfg, sample_weighting="sample"))
    assert learner.weights == [1.0] * 10


@pytest.mark.parametrize("level", ["sequence", "geometric"])
def test_sequence_level_importance_ratios_stop_at_a_sample_break(level):
    # one episode, two samples (rows): the first drifted from the sampler, the second did
    # not. A sequence-level ratio is each sample's own: the break is never crossed, so the
    # first sample's drift cannot drop the second.
    from tracerl.algos.losses import PolicyLossInput, ppo_clip

    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0], [0.0, 1.0, 1.0, 0.0]])
    lp = torch.zeros(2, 4, requires_grad=True)
    behaviour = torch.tensor([[0.0, 2.0, 2.0, 2.0], [0.0, 0.01, -0.01, 0.0]])
    inp = PolicyLossInput(lp, lp.detach(), torch.tensor([1.0, 1.0]), mask, behaviour)
    cfg = ClipConfig(is_mask=level, agg="seq-mean-token-mean")
    loss, metrics = ppo_clip(inp, cfg)
    loss.backward()
    assert metrics["is_masked_frac"] == pytest.approx(3 / 5)  # the first sample's tokens
    assert lp.grad[0].abs().sum() == 0 and lp.grad[1, 1:3].abs().min() > 0


def test_reasoning_a_qwen3_template_strips_becomes_samples_of_one_episode(family_renderer):
    # Qwen3's template drops the reasoning of earlier assistant turns once a later user turn
    # arrives: the tokens the model sampled (with its <think>) are no longer a prefix of the
    # conversation. The episode goes on in a new sample instead of splicing; every sample
    # trains with the episode's advantage, on its own policy tokens, at its share.
    from tracerl.envs import Arithmetic
    from tracerl.rollout import ScriptedSampler

    r = family_renderer("qwen3")
    turns = [  # an unreadable call: the note asking again is a user turn, after which
        # the template no longer prints this turn's reasoning
        "<think>\nThe digits are 3 and 4, so the sum is 7.\n</think>\n\n"
        "<tool_call>\n{oops\n</tool_call>",
        "<think>\nRecheck: 3+4=7.\n</think>\n\n7",
    ]
    policy = Policy(ScriptedSampler.from_texts(r, turns), r, get_parser("hermes"), "qwen3")
    cfg = RolloutConfig(budgets=Budgets(steps=3), reserve=None)
    task = {"id": "sum-3-4", "a": 3, "b": 4, "answers": ["7"]}
    ep = asyncio.run(run_episode(Arithmetic(), task, policy, cfg, seed=0))
    assert ep.stop_reason.value == "answered"
    first, second = ep.trajectories
    assert first.steps[-1]["prefix_break"]  # the break is recorded, not guessed later
    think = "The digits are 3 and 4"
    assert think in "".join(s.text or "" for s in first.policy_segments())
    assert think not in r.decode(second.token_ids)  # the template's view of history
    assert sum(first.loss_mask) + sum(second.loss_mask) == sum(
        len(s.token_ids) for t in ep.trajectories for s in t.policy_segments()
    )
    assert row_shares(ep, "episode") == [0.5, 0.5]
