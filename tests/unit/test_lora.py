"""LoRA training: only the adapters move, the reference policy is the same model with its
adapters off (no second copy), a KL term pulls back toward it, and a checkpoint holds the
adapters only and restores them exactly."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch

from tracerl.envs import get_parser, make
from tracerl.rollout import HFSampler
from tracerl.rollout.budget import Budgets, RolloutConfig
from tracerl.rollout.runner import Policy, run_episode
from tracerl.train import padded_batch, token_logprobs
from tracerl.train.checkpoint import latest_checkpoint, restore, save_checkpoint
from tracerl.train.learner import Learner, LearnerConfig
from tracerl.train.lora import Reference, apply_lora, is_lora, trainable_state

CFG = RolloutConfig(budgets=Budgets(steps=1), max_turn_tokens=6, reserve=None)


@pytest.fixture
def lora_model(tiny):
    return apply_lora(copy.deepcopy(tiny.model), r=4, alpha=8)


def _trajectories(tiny, model, n=2):
    sampler = HFSampler(model, temperature=1.0)
    policy = Policy(sampler, tiny.renderer, get_parser("json_list"), "t")
    task = make("refund_desk").sample_tasks(1)[0]
    return [
        asyncio.run(run_episode(make("refund_desk"), task, policy, CFG, seed=s)).trajectories[0]
        for s in range(n)
    ]


def _logprob(model, trajs):
    b = padded_batch(trajs, [0.0] * len(trajs))
    with torch.no_grad():
        lp = token_logprobs(model, b.input_ids_B_T, b.attention_mask_B_T)
    return (lp * b.loss_mask_B_T).sum(-1)


def test_lora_moves_the_policy_but_only_the_adapters(tiny, lora_model):
    trajs = _trajectories(tiny, lora_model)
    base = {n: p.detach().clone() for n, p in lora_model.named_parameters() if "lora_" not in n}
    before = _logprob(lora_model, trajs)
    learner = Learner(lora_model, LearnerConfig(lr=1e-2, micro_batch_tokens=64))
    for _ in range(3):
        learner.update(trajs, [1.0, -1.0])
    after = _logprob(lora_model, trajs)
    assert after[0] > before[0] + 0.5 and after[1] < before[1] - 0.5
    for n, p in lora_model.named_parameters():
        if "lora_" not in n:
            assert torch.equal(p, base[n]), f"base weight {n} moved"
    # the optimizer holds adapters only: a small fraction of the model
    n_opt = sum(p.numel() for g in learner.optimizer.param_groups for p in g["params"])
    assert n_opt < 0.2 * sum(p.numel() for p in lora_model.parameters())


def test_the_reference_is_the_model_with_adapters_disabled(tiny, lora_model):
    trajs = _trajectories(tiny, lora_model)
    Learner(lora_model, LearnerConfig(lr=1e-2, micro_batch_tokens=64)).update(trajs, [1.0, -1.0])
    ref = Reference(lora_model)
    assert ref._copy is None  # no second copy of the weights
    with ref.active() as m:
        ref_lp = _logprob(m, trajs)
    assert torch.allclose(ref_lp, _logprob(tiny.model, trajs), atol=1e-5)  # the base policy
    assert not torch.allclose(ref_lp, _logprob(lora_model, trajs), atol=1e-3)  # adapters back on


def test_a_kl_term_holds_the_policy_near_the_reference(tiny):
    def drift(kl_coef):
        model = apply_lora(copy.deepcopy(tiny.model), r=4, alpha=8)
        trajs = _trajectories(tiny, model)
        learner = Learner(model, LearnerConfig(lr=1e-2, micro_batch_tokens=64, kl_coef=kl_coef))
        for _ in range(6):
            m = learner.update(trajs, [1.0, -1.0])
        return float((_logprob(model, trajs) - _logprob(tiny.model, trajs)).abs().sum()), m

    free, _ = drift(0.0)
    held, m = drift(5.0)
    assert m["train/kl"] > 0
    assert held < 0.8 * free


def test_a_lora_checkpoint_holds_the_adapters_and_restores_them(tiny, lora_model, tmp_path):
    trajs = _trajectories(tiny, lora_model)
    learner = Learner(lora_model, LearnerConfig(lr=1e-2, micro_batch_tokens=64))
    learner.update(trajs, [1.0, -1.0])
    sampler = HFSampler(lora_model)
    save_checkpoint(tmp_path, 0, lora_model, learner, sampler, {})
    saved = torch.load(tmp_path / "checkpoints/step_0/model.pt", weights_only=True)
    assert saved and all("lora_" in k for k in saved)
    expected = _logprob(lora_model, trajs)

    fresh = apply_lora(copy.deepcopy(tiny.model), r=4, alpha=8)
    assert is_lora(fresh) and set(trainable_state(fresh)) == set(saved)
    restore(latest_checkpoint(tmp_path), fresh, Learner(fresh), HFSampler(fresh))
    assert torch.allclose(_logprob(fresh, trajs), expected, atol=1e-6)


def test_adapters_start_from_the_run_seed_so_two_runs_update_alike(tiny):
    """peft draws the adapters' A at random: with one seed two runs start (and so update)
    from the same adapters, whatever the global random state; another seed differs."""

    def adapters(seed):
        torch.manual_seed(1234 + seed)  # a global state that must not matter
        m = apply_lora(copy.deepcopy(tiny.model), r=4, alpha=8, seed=seed)
        return {k: v.clone() for k, v in m.state_dict().items() if "lora_A" in k}

    a, b, c = adapters(0), adapters(0), adapters(1)
    assert a and all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)
