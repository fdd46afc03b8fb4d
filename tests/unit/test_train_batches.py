"""Batches and log-probs: the lean paths equal the plain ones, and the learner's log-probs of
a sampled episode equal the sampler's on exactly the policy tokens."""

from __future__ import annotations

import asyncio

import pytest
import torch

from tracerl.envs import make
from tracerl.rollout import HFSampler
from tracerl.rollout.budget import Budgets, RolloutConfig
from tracerl.rollout.groups import run_group
from tracerl.rollout.runner import Policy
from tracerl.train import bucketed_batches, padded_batch, token_logprobs


@pytest.fixture(scope="module")
def episodes(tiny):
    policy = Policy.from_bundle(tiny, HFSampler(tiny.model, temperature=0.9))
    cfg = RolloutConfig(budgets=Budgets(steps=2), max_turn_tokens=16)
    tasks = make("refund_desk").sample_tasks(3, seed=1)
    eps = []
    for task in tasks:  # one asyncio.run each: the sampler must survive a new event loop
        eps += asyncio.run(run_group("refund_desk", task, policy, cfg, group_size=2, seed=4))
    assert all(e.receipt.error is None for e in eps)
    return eps


def _full_logprobs(model, ids, attn, temperature):
    logits = model(input_ids=ids, attention_mask=attn).logits.float() / temperature
    lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
    return torch.cat([torch.zeros(ids.shape[0], 1), lp], 1) * attn


@pytest.fixture(scope="module")
def full_softmax(tiny, episodes):
    """The plain log-softmax's log-probs and gradients of the episodes' batch, computed once
    (6 rows x 446 tokens x 49,152 logits: the costly side of every comparison below)."""
    trajs = [t for e in episodes for t in e.trajectories]
    b = padded_batch(trajs, [1.0] * len(trajs))
    model = tiny.model
    model.zero_grad()
    full = _full_logprobs(model, b.input_ids_B_T, b.attention_mask_B_T, 0.9)
    (full * b.loss_mask_B_T).sum().backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    return b, full.detach(), want


@pytest.mark.parametrize("only", [False, True])
@pytest.mark.parametrize("chunk", [7, 64, 100_000])
def test_chunked_logprobs_and_gradients_equal_the_full_log_softmax(tiny, full_softmax, chunk, only):
    b, full, want = full_softmax
    model = tiny.model
    model.zero_grad()
    lean = token_logprobs(
        model,
        b.input_ids_B_T,
        b.attention_mask_B_T,
        temperature=0.9,
        chunk_tokens=chunk,
        only_B_T=b.loss_mask_B_T if only else None,
    )
    (lean * b.loss_mask_B_T).sum().backward()
    if only:  # the LM head ran on policy tokens only: the rest is 0, the loss the same
        on = b.loss_mask_B_T.bool()
        assert torch.allclose(lean[on], full[on], atol=1e-5) and (lean[~on] == 0).all()
    else:
        assert torch.allclose(lean, full, atol=1e-5)
    for n, p in model.named_parameters():  # same gradients, up to summation order
        rel = ((p.grad - want[n]).norm() / want[n].norm().clamp(min=1e-12)).item()
        assert rel < 1e-4, (n, rel)
    model.zero_grad()


def test_learner_logprobs_equal_the_samplers_on_policy_tokens(tiny, episodes):
    trajs = [t for e in episodes for t in e.trajectories]
    b = padded_batch(trajs, [0.0] * len(trajs))
    with torch.no_grad():
        lp = token_logprobs(tiny.model, b.input_ids_B_T, b.attention_mask_B_T, temperature=0.9)
    on = b.loss_mask_B_T.bool()
    assert on.sum() == sum(sum(t.loss_mask) for t in trajs) > 0
    assert torch.allclose(lp[on], b.old_logprobs_B_T[on], atol=1e-4)
    assert (b.old_logprobs_B_T[~on] == 0).all()


def test_bucketing_keeps_every_row_and_cuts_padding(tiny, episodes):
    trajs = [t for e in episodes for t in e.trajectories]
    adv = [float(i) for i in range(len(trajs))]
    plain = padded_batch(trajs, adv)
    lengths = sorted(len(t) for t in trajs)
    buckets = bucketed_batches(trajs, adv, max_tokens=2 * lengths[-1])
    assert sorted(i for bb in buckets for i in bb.rows) == list(range(len(trajs)))
    assert sum(bb.padded_tokens for bb in buckets) <= plain.padded_tokens
    assert sum(bb.tokens for bb in buckets) == plain.tokens
    for bb in buckets:  # each row's tensors equal its row in the plain batch
        for k, i in enumerate(bb.rows):
            n = len(trajs[i])
            assert torch.equal(bb.input_ids_B_T[k, :n], plain.input_ids_B_T[i, :n])
            assert torch.equal(bb.loss_mask_B_T[k, :n], plain.loss_mask_B_T[i, :n])
            assert bb.advantages_B[k] == adv[i]


def test_shared_prefix_batches_run_a_groups_prompt_once_with_the_same_logprobs_and_grads(
    tiny, episodes
):
    from tracerl.train.batch import shared_prefix_batches

    trajs = [t for e in episodes for t in e.trajectories]
    adv = [float(i) for i in range(len(trajs))]
    batches = shared_prefix_batches(trajs, adv, max_tokens=100_000)
    assert sorted(i for b in batches for i in b.rows) == list(range(len(trajs)))
    shared = [b for b in batches if b.prefix_len]
    assert shared, "the members of a group share their prompt"
    model = tiny.model
    for b in shared:
        ids, attn = b.input_ids_B_T, b.attention_mask_B_T
        assert (ids[:, : b.prefix_len] == ids[:1, : b.prefix_len]).all()
        assert b.loss_mask_B_T[:, : b.prefix_len].sum() == 0  # nothing in it is trained
        model.zero_grad()
        full = _full_logprobs(model, ids, attn, 0.9)
        (full * b.loss_mask_B_T * b.advantages_B[:, None]).sum().backward()
        want = {n: p.grad.clone() for n, p in model.named_parameters()}
        model.zero_grad()
        lean = token_logprobs(
            model, ids, attn, temperature=0.9, only_B_T=b.loss_mask_B_T, prefix_len=b.prefix_len
        )
        (lean * b.loss_mask_B_T * b.advantages_B[:, None]).sum().backward()
        on = b.loss_mask_B_T.bool()
        assert torch.allclose(lean[on], full[on], atol=1e-5)
        for n, p in model.named_parameters():
            rel = ((p.grad - want[n]).norm() / want[n].norm().clamp(min=1e-12)).item()
            assert rel < 1e-4, (n, rel)
        model.zero_grad()
