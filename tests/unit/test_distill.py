"""On-policy distillation (``trainer.distill``): the teacher grades the student's policy tokens,
in the student's own context, and nothing else.

Hand-computed: a teacher equal to the student gives 0 on every token; another model's
per-token values equal ``log p_teacher - log p_student`` from one plain forward pass; tool
output, echoes and template tokens never get a teacher term nor count in the KL; a teacher
that fails on one sample leaves that sample out and the others trained."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch

from tests.sampled import sampled_trajectories
from tracerl.algos.distill import mix, teacher_advantages, turn_spans
from tracerl.models import load
from tracerl.models.loading import load_tiny_random
from tracerl.train.distill import Distiller, ModelTeacher
from tracerl.types import Source

T = 0.7


@pytest.fixture(scope="module")
def student():
    return load("tiny-random")


@pytest.fixture(scope="module")
def rows(student):
    """Three sampled trajectories of three turns each: policy turns, tool output, template
    scaffolding between them."""
    return sampled_trajectories(student, T, seed=11, tokens=lambda k: 6 + 2 * k)


def full_forward_logprobs(model, t):
    """log p(token_t | tokens_<t) at temperature T, one plain forward pass, no chunking."""
    with torch.no_grad():
        logits = model(torch.tensor([t.token_ids])).logits[0]
    lp = torch.log_softmax(logits[:-1].float() / T, dim=-1)
    got = lp.gather(1, torch.tensor(t.token_ids[1:])[:, None])[:, 0]
    return [0.0, *got.tolist()]


class Fixed:
    """A teacher with known answers: the student's own log-probs plus `shift` on policy tokens,
    and `junk` everywhere else (which nothing may read); `fail`: rows it cannot score."""

    identity, label = "fixed", "fixed"

    def __init__(self, shift=-0.5, junk=99.0, fail=()):
        self.shift, self.junk, self.fail = shift, junk, set(fail)
        self.asked = 0

    def logprobs(self, rows, temperature):
        self.asked += len(rows)
        out = []
        for t in rows:
            if t.episode_id in self.fail:
                out.append("TimeoutError: the teacher took too long")
                continue
            pairs = zip(t.logprobs, t.loss_mask, strict=True)
            out.append([v + self.shift if m else self.junk for v, m in pairs])
        return out


def named(rows):
    return [dataclasses.replace(t, episode_id=f"e{i}") for i, t in enumerate(rows)]


def test_the_trajectories_hold_every_kind_of_token(rows):
    kinds = {s.source for t in rows for s in t.segments}
    assert {Source.PROMPT, Source.POLICY, Source.ENVIRONMENT, Source.TEMPLATE} <= kinds
    assert all(len(turn_spans(t.loss_mask)) == 3 for t in rows)


def test_a_teacher_equal_to_the_student_gives_zero_on_every_token(student, rows):
    same = ModelTeacher(copy.deepcopy(student.model), "same", "same", micro_batch_tokens=64)
    d = Distiller(same, temperature=T, outcome_weight=0.0).apply(rows, [0.0] * len(rows))
    assert d.keep == [0, 1, 2]
    for t, adv in zip(rows, d.advantages, strict=True):
        assert len(adv) == len(t)
        assert max(abs(v) for v in adv) < 1e-4  # the sampler's and the teacher's float noise
    assert abs(d.metrics["train/distill/reverse_kl"]) < 1e-5
    assert d.metrics["train/distill/coverage"] == 1.0


def test_another_model_gives_its_log_prob_minus_the_students_on_policy_tokens_only(rows):
    other = load_tiny_random(seed=1).model
    teacher = ModelTeacher(copy.deepcopy(other), "seed1", "seed1")
    outcome = [0.5, -1.0, 0.0]
    d = Distiller(teacher, temperature=T, outcome_weight=2.0, distill_weight=0.5).apply(
        rows, outcome
    )
    kl, n = 0.0, 0
    for t, a, adv in zip(rows, outcome, d.advantages, strict=True):
        want = full_forward_logprobs(other, t)
        for i, (m, s) in enumerate(zip(t.loss_mask, t.logprobs, strict=True)):
            if m:
                assert adv[i] == pytest.approx(2.0 * a + 0.5 * (want[i] - s), abs=1e-4)
                kl += s - want[i]
                n += 1
            else:  # prompt, tool output, template: nothing
                assert adv[i] == 0.0
    assert d.metrics["train/distill/reverse_kl"] == pytest.approx(kl / n, abs=1e-5)
    assert d.metrics["train/distill/reverse_kl"] > 0.1  # another model: a real distance


def test_tool_output_and_template_tokens_never_reach_the_advantage_or_the_kl(rows):
    d = Distiller(Fixed(shift=-0.5, junk=99.0), temperature=T, outcome_weight=0.0).apply(
        rows, [0.0] * len(rows)
    )
    for t, adv in zip(rows, d.advantages, strict=True):
        assert {v for v, m in zip(adv, t.loss_mask, strict=True) if not m} == {0.0}
        assert {round(v, 6) for v, m in zip(adv, t.loss_mask, strict=True) if m} == {-0.5}
    # the KL is the mean over policy tokens only: exactly the shift, the junk unseen
    assert d.metrics["train/distill/reverse_kl"] == pytest.approx(0.5)
    tokens_per_turn = [e - b for t in rows for b, e in turn_spans(t.loss_mask)]
    want_turn = 0.5 * sum(tokens_per_turn) / len(tokens_per_turn)
    assert d.metrics["train/distill/reverse_kl_turn"] == pytest.approx(want_turn)


def test_a_teacher_failing_on_one_sample_leaves_the_others_trained(rows):
    rows = named(rows)
    teacher = Fixed(fail={"e1"})
    d = Distiller(teacher, temperature=T).apply(rows, [1.0, 1.0, 1.0], [1.0, 1.0, 0.5])
    assert d.keep == [0, 2]  # e1 is the evaluator's: left out, never a zero
    assert d.metrics["train/distill/teacher_failures"] == 1.0
    covered = sum(sum(rows[i].loss_mask) for i in (0, 2)) / sum(sum(t.loss_mask) for t in rows)
    assert d.metrics["train/distill/coverage"] == pytest.approx(covered)
    third = [v for v, m in zip(d.advantages[1], rows[2].loss_mask, strict=True) if m]
    assert {round(v, 6) for v in third} == {0.25}  # 0.5 x (1.0 outcome - 0.5 teacher)


def test_the_steps_teacher_budget_refuses_what_is_past_it(rows):
    first = sum(rows[0].loss_mask)
    d = Distiller(Fixed(), temperature=T, tokens_per_step=first).apply(rows, [0.0] * 3)
    assert d.keep == [0]
    assert d.metrics["train/distill/budget_refusals"] == 2.0


def test_scores_are_cached_by_teacher_and_tokens(rows, tmp_path):
    from tracerl.rewards.judge import VerdictCache

    cache = VerdictCache(tmp_path)
    teacher = Fixed()
    first = Distiller(teacher, temperature=T, cache=cache).apply(rows, [0.0] * 3)
    again = Distiller(teacher, temperature=T, cache=cache).apply(rows, [0.0] * 3)
    assert teacher.asked == 3  # the second pass asked nothing
    assert again.advantages == first.advantages
    assert again.metrics["train/distill/cache_hit_rate"] == 1.0
    assert again.metrics["train/distill/teacher_tokens"] == 0.0
    hotter = Distiller(teacher, temperature=1.0, cache=cache).apply(rows, [0.0] * 3)
    assert teacher.asked == 6 and hotter.metrics["train/distill/cache_hit_rate"] == 0.0


def test_a_teacher_model_that_raises_fails_only_its_batch(rows):
    class Broken(torch.nn.Module):
        def get_decoder(self):
            raise RuntimeError("out of memory")

    teacher = ModelTeacher(Broken(), "broken", "broken")
    d = Distiller(teacher, temperature=T).apply(rows, [1.0] * 3)
    assert d.keep == [] and d.metrics["train/distill/teacher_failures"] == 3.0


def test_the_math_refuses_misaligned_inputs():
    with pytest.raises(ValueError, match="one each per token"):
        teacher_advantages([0.0, -1.0], [0.0], [0, 1])
    assert mix([1.0, 2.0, 3.0], [0.0, -1.0, 0.5], [0, 1, 1], 1.0, 2.0) == [0.0, 0.0, 4.0]
    assert turn_spans([0, 1, 1, 0, 0, 1]) == [(1, 3), (5, 6)]
    assert math.isclose(mix(0.5, [0.0, 0.1], [1, 1], 0.0, 1.0)[1], 0.1)


def test_the_update_trains_every_scored_sample_and_finds_signal_in_tied_groups(tiny):
    import asyncio

    from tests.unit.test_subagents import Archive, scripted
    from tracerl.rollout.budget import Budgets, RolloutConfig
    from tracerl.rollout.context import SubagentConfig
    from tracerl.rollout.runner import run_episode
    from tracerl.train.grpo import GRPOConfig, has_signal, update_on_groups
    from tracerl.types import RewardBreakdown

    cfg = RolloutConfig(
        budgets=Budgets(steps=4), reserve=None, subagents=SubagentConfig(), max_turn_tokens=48
    )

    def episode(k):
        ep = asyncio.run(
            run_episode(Archive(), {"id": "t"}, scripted(tiny), cfg, seed=0, episode_id=f"e{k}")
        )
        return dataclasses.replace(ep, reward=RewardBreakdown.scalar(1.0, ep.attribution))

    group = [episode(k) for k in range(3)]  # every reward 1: no outcome signal
    assert all(len(e.trajectories) == 2 for e in group)  # a parent and its sub-agent each

    class Learner:
        def update(self, rows, advantages, *, lr_scale=1.0, weights=None):
            self.rows, self.advantages, self.weights = rows, advantages, weights
            return {}

    assert not has_signal(group, GRPOConfig(group_size=3))
    distill = Distiller(Fixed(shift=-0.25, fail={"e1"}), temperature=T, outcome_weight=0.0)
    on = GRPOConfig(group_size=3, distill=distill)
    assert has_signal(group, on)  # the teacher grades every policy token
    learner = Learner()
    m = update_on_groups([group], learner, on)
    assert [t.episode_id for t in learner.rows] == ["e0", "e0", "e2", "e2"]
    assert learner.weights == [0.5] * 4  # each episode still weighs one, over its samples
    for t, adv in zip(learner.rows, learner.advantages, strict=True):
        assert {round(v, 6) for v, msk in zip(adv, t.loss_mask, strict=True) if msk} == {-0.25}
    assert m["train/distill/teacher_failures"] == 2.0  # e1's parent and its sub-agent
    assert m["train/distill/reverse_kl"] == pytest.approx(0.25)


def test_a_step_whose_teacher_graded_under_half_says_so():
    from tracerl.train.distill import coverage_warning

    assert coverage_warning(3, {"train/reward_mean": 1.0}) is None  # no teacher
    assert coverage_warning(3, {"train/distill/coverage": 0.75}) is None
    line = coverage_warning(
        3, {"train/distill/coverage": 0.25, "train/distill/teacher_failures": 6.0}
    )
    assert line is not None and "step 3" in line and "25%" in line and "6 samples failed" in line
