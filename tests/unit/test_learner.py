"""The learner moves log-probs the way the advantages say, and a GRPO step wires the
rollout engine, eligibility, advantages and the learner together."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch

from tracerl.envs import RefundDesk, get_parser, make
from tracerl.rollout import HFSampler, ScriptedSampler
from tracerl.rollout.budget import Budgets, RetryPolicy, RolloutConfig
from tracerl.rollout.runner import Policy, run_episode
from tracerl.train import padded_batch, token_logprobs
from tracerl.train.grpo import GRPOConfig, grpo_step
from tracerl.train.learner import Learner, LearnerConfig

CFG = RolloutConfig(budgets=Budgets(steps=1), max_turn_tokens=6, reserve=None)


@pytest.fixture
def model(tiny):
    return copy.deepcopy(tiny.model)  # updates must not leak into other tests


def _episodes(tiny, model, n=2):
    policy = Policy(HFSampler(model, temperature=1.0), tiny.renderer, get_parser("json_list"), "t")
    task = make("refund_desk").sample_tasks(1)[0]
    return [
        asyncio.run(run_episode(make("refund_desk"), task, policy, CFG, seed=s)) for s in range(n)
    ]


def _policy_logprob(model, trajs):
    b = padded_batch(trajs, [0.0] * len(trajs))
    with torch.no_grad():
        lp = token_logprobs(model, b.input_ids_B_T, b.attention_mask_B_T)
    return (lp * b.loss_mask_B_T).sum(-1)


def test_an_update_raises_what_was_rewarded_and_lowers_what_was_not(tiny, model):
    trajs = [e.trajectories[0] for e in _episodes(tiny, model)]
    before = _policy_logprob(model, trajs)
    learner = Learner(model, LearnerConfig(lr=1e-3, micro_batch_tokens=64))
    for _ in range(3):
        m = learner.update(trajs, [1.0, -1.0])
    after = _policy_logprob(model, trajs)
    assert after[0] > before[0] + 1.0 and after[1] < before[1] - 1.0
    assert m["train/policy_tokens"] == sum(sum(t.loss_mask) for t in trajs)
    assert m["train/micro_batches"] >= 2 and m["train/grad_norm"] > 0


def test_an_update_shows_its_micro_batches_on_the_progress_bars(tiny, model):
    class Bars:
        def __init__(self):
            self.phases, self.advanced = [], 0

        def phase(self, description, total):
            self.phases.append((description, total))

        def advance(self, _=None):
            self.advanced += 1

    trajs = [e.trajectories[0] for e in _episodes(tiny, model)]
    learner = Learner(model, LearnerConfig(lr=1e-4, micro_batch_tokens=64, epochs=2))
    learner.progress = bars = Bars()
    m = learner.update(trajs, [1.0, -1.0])
    total = 2 * int(m["train/micro_batches"])
    assert bars.phases == [("update micro-batches", total)] and bars.advanced == total


def test_a_grpo_step_trains_only_on_eligible_episodes(tiny, model):
    # scripted answers that end their turn, so the env's answer handler runs
    sampler = ScriptedSampler.from_texts(tiny.renderer, lambda r: f"Answer {r.episode_id[-1]}.")
    policy = Policy(sampler, tiny.renderer, get_parser("json_list"), "t")
    learner = Learner(model, LearnerConfig(lr=1e-4))
    cfg = GRPOConfig(
        group_size=4, rollout=CFG.model_copy(update={"retry": RetryPolicy(max_retries=0)})
    )
    tasks = make("refund_desk").sample_tasks(2)
    made = []

    class Broken(RefundDesk):  # its answer handler crashes: an env bug, nobody's signal
        async def finish(self, action):
            raise RuntimeError("grader backend down")

    def env():
        made.append(Broken() if len(made) % 2 else make("refund_desk"))
        return made[-1]

    def reward(e):
        return float(e.episode_id.endswith(("g0", "g2")))

    m, episodes = grpo_step(env, tasks, policy, learner, reward, cfg, step=0)
    assert len(episodes) == 8 and sampler.policy_version == 1
    assert m["train/policy_version"] == 1.0 and "stop/answered" in m
    broken = [e for e in episodes if not e.gradient_eligible]
    assert len(broken) == 4 and all(e.trajectories[0].count("policy") > 0 for e in broken)
    eligible_tokens = sum(
        sum(t.loss_mask) for e in episodes if e.gradient_eligible for t in e.trajectories
    )
    assert m["train/policy_tokens"] == eligible_tokens


@pytest.mark.parametrize(
    "agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
)
def test_micro_batching_gives_the_whole_batch_gradient_for_every_aggregation(tiny, model, agg):
    from tracerl.algos import ClipConfig

    trajs = [e.trajectories[0] for e in _episodes(tiny, model, n=4)]
    advs = [1.0, -0.5, 0.25, -1.0]
    grads = []
    for micro in (10**6, 1):  # one batch, then one row per micro-batch
        m = copy.deepcopy(model)
        cfg = LearnerConfig(
            lr=1e-12, micro_batch_tokens=micro, max_grad_norm=1e9, clip=ClipConfig(agg=agg)
        )
        out = Learner(m, cfg).update(trajs, advs)
        grads.append({n: p.grad.clone() for n, p in m.named_parameters()})
        assert out["train/micro_batches"] == (1 if micro > 1 else 4)
    for n, g in grads[0].items():
        rel = ((grads[1][n] - g).norm() / g.norm().clamp(min=1e-12)).item()
        assert rel < 1e-4, (agg, n, rel)


def test_gradient_checkpointing_recomputes_layers_and_changes_nothing_else(tiny):
    trajs = [e.trajectories[0] for e in _episodes(tiny, copy.deepcopy(tiny.model))]

    def update(gc: bool):
        model = copy.deepcopy(tiny.model)
        calls = []
        # a module early in the layer: transformers checkpoints the layer's forward, so the
        # layer's own hooks stay outside the recomputation (and torch stops recomputing once
        # the last saved tensor is back, before the layer's last modules)
        q_proj = model.get_decoder().layers[0].self_attn.q_proj
        q_proj.register_forward_hook(lambda *_: calls.append(1))
        cfg = LearnerConfig(
            lr=1e-3, micro_batch_tokens=10_000, gradient_checkpointing=gc, share_prefix=False
        )
        m = Learner(model, cfg).update(trajs, [1.0, -1.0])
        assert not model.training  # back in eval mode for the sampler
        return len(calls), m, model

    plain_calls, plain, plain_model = update(False)
    gc_calls, checkpointed, gc_model = update(True)
    assert plain_calls == 1 and gc_calls == 2  # one micro-batch; recomputed in backward
    assert abs(plain["train/loss"] - checkpointed["train/loss"]) < 1e-6
    for p, q in zip(plain_model.parameters(), gc_model.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6)


def test_sharing_a_groups_prompt_gives_the_same_update(tiny):
    model = copy.deepcopy(tiny.model)
    trajs = [e.trajectories[0] for e in _episodes(tiny, model, n=4)]  # one task: one prompt

    def update(share: bool):
        m = copy.deepcopy(tiny.model)
        cfg = LearnerConfig(lr=1e-3, micro_batch_tokens=10_000, share_prefix=share)
        metrics = Learner(m, cfg).update(trajs, [1.0, -1.0, 0.5, -0.5])
        return metrics, m

    plain, plain_model = update(False)
    shared, shared_model = update(True)
    assert abs(plain["train/loss"] - shared["train/loss"]) < 1e-6
    assert abs(plain["train/grad_norm"] / shared["train/grad_norm"] - 1) < 1e-4
    # the updated policies agree (Adam amplifies float noise in near-zero gradients, so
    # compare what the policy does, not every weight bit for bit)
    assert torch.allclose(
        _policy_logprob(plain_model, trajs), _policy_logprob(shared_model, trajs), atol=1e-3
    )


def test_a_compiled_learner_computes_the_same_update(tiny):
    # torch.compile of the decoder (inductor on CPU): slow to compile (~40 s), same numbers
    trajs = [e.trajectories[0] for e in _episodes(tiny, copy.deepcopy(tiny.model))]

    def update(compiled: bool):
        m = copy.deepcopy(tiny.model)
        cfg = LearnerConfig(lr=1e-3, micro_batch_tokens=10_000, compile=compiled)
        return Learner(m, cfg).update(trajs, [1.0, -1.0])

    eager, compiled = update(False), update(True)
    assert abs(eager["train/loss"] - compiled["train/loss"]) < 1e-5
    assert abs(eager["train/grad_norm"] / compiled["train/grad_norm"] - 1) < 1e-3


def test_an_update_that_runs_out_of_memory_halves_its_micro_batches_and_is_the_same(
    tiny, model, monkeypatch
):
    """Device memory for a micro-batch of more than a budget's tokens is out (simulated on
    the CPU: torch's OutOfMemoryError past it): the update halves its micro-batches until
    they fit and makes the update one sized to fit from the start makes; later updates keep
    the smaller size. Past the optimizer's step, or at one row per micro-batch, it says what
    to set instead."""
    trajs = [e.trajectories[0] for e in _episodes(tiny, model, n=4)]
    advs = [1.0, -0.5, 0.25, -1.0]
    widest = max(len(t.token_ids) for t in trajs)
    fits = 2 * widest  # two rows fit, four do not

    def tight(learner):
        forward = learner._logprobs

        def guarded(batch, **kw):
            if batch.input_ids_B_T.numel() > fits:
                raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
            return forward(batch, **kw)

        learner._logprobs = guarded
        return learner

    cramped = copy.deepcopy(model)
    learner = tight(Learner(cramped, LearnerConfig(lr=1e-3, micro_batch_tokens=8 * widest)))
    got = learner.update(trajs, advs)
    size = got["train/micro_batch_tokens"]
    assert learner.shrunk >= 1 and size == 8 * widest // 2**learner.shrunk
    assert got["train/micro_batches"] > 1
    roomy = copy.deepcopy(model)  # sized to fit from the start
    want = Learner(roomy, LearnerConfig(lr=1e-3, micro_batch_tokens=int(size))).update(trajs, advs)
    assert got["train/micro_batches"] == want["train/micro_batches"]
    for (n, a), b in zip(roomy.named_parameters(), cramped.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6), n
    shrunk = learner.shrunk
    learner.update(trajs, advs)  # the next update starts at the size that fit
    assert learner.shrunk == shrunk

    one_row = tight(Learner(copy.deepcopy(model), LearnerConfig(micro_batch_tokens=widest)))
    fits = widest // 2  # not even one row fits
    with pytest.raises(torch.OutOfMemoryError, match=r"trainer\.micro_batch_tokens"):
        one_row.update(trajs, advs)
