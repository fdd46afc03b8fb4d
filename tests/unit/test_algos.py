"""The math, against numbers worked out by hand (in the comments)."""

from __future__ import annotations

import math

import pytest
import torch

from tracerl.algos import ADVANTAGES, ClipConfig, PolicyLossInput, aggregate, kl, ppo_clip
from tracerl.algos.advantages import get

# Group 0: rewards 1, 0, 0, 1 with the third ineligible (an outage); group 1: 0.5, 0.5.
REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5])
GROUPS = torch.tensor([0, 0, 0, 0, 1, 1])
ELIGIBLE = torch.tensor([True, True, False, True, True, True])
S3 = math.sqrt(1 / 3)  # unbiased std of (1, 0, 1): sqrt((1/9 + 4/9 + 1/9) / 2)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # (r - 2/3) / std; the ineligible member and the zero-variance group get 0
        ("grpo", [(1 / 3) / S3, (-2 / 3) / S3, 0, (1 / 3) / S3, 0, 0]),
        ("dr_grpo", [1 / 3, -2 / 3, 0, 1 / 3, 0, 0]),
        # leave-one-out: 1 - mean(0, 1) = 0.5; 0 - mean(1, 1) = -1
        ("rloo", [0.5, -1.0, 0, 0.5, 0, 0]),
        # group-centred (1/3, -2/3, 1/3, 0, 0) whitened over the batch: std sqrt(1/6)
        (
            "reinforce_pp_baseline",
            [
                (1 / 3) / math.sqrt(1 / 6),
                (-2 / 3) / math.sqrt(1 / 6),
                0,
                (1 / 3) / math.sqrt(1 / 6),
                0,
                0,
            ],
        ),
    ],
)
def test_advantages_by_hand(name, expected):
    out = get(name)(REWARDS, GROUPS, ELIGIBLE)
    assert torch.allclose(out, torch.tensor(expected), atol=1e-5), (name, out)
    assert torch.isfinite(out).all()


def test_a_group_with_one_eligible_member_has_no_baseline():
    for name, fn in ADVANTAGES.items():
        out = fn(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), torch.tensor([True, False]))
        assert torch.equal(out, torch.zeros(2)), name
    with pytest.raises(KeyError, match="grpo"):
        get("ppo")


LOGP = torch.log(torch.tensor([[1.5, 0.5, 1.0]]))  # with old = 0: ratios 1.5, 0.5, 1.0
OLD = torch.zeros(1, 3)
MASK = torch.tensor([[1, 1, 0]])


def _loss(adv, **cfg):
    logp = LOGP.clone().requires_grad_(True)
    inp = PolicyLossInput(logp, OLD, torch.tensor([adv]), MASK, cfg.pop("behavior", None))
    loss, metrics = ppo_clip(inp, ClipConfig(**cfg))
    return loss, metrics, logp


def test_ppo_clip_by_hand():
    # A=+1: token 0: max(-1.5, -1.2) = -1.2 (clipped); token 1: max(-0.5, -0.8) = -0.5
    loss, m, logp = _loss(1.0)
    assert loss.item() == pytest.approx((-1.2 - 0.5) / 2)
    assert m["clip_frac"] == pytest.approx(0.5)
    loss.backward()
    # clipped token: no gradient; token 1: d(-r/2)/dlogp = -r/2 = -0.25; masked token: 0
    assert torch.allclose(logp.grad, torch.tensor([[0.0, -0.25, 0.0]]))
    # A=-1: token 0: max(1.5, 1.2) = 1.5; token 1: max(0.5, 0.8) = 0.8
    assert _loss(-1.0)[0].item() == pytest.approx((1.5 + 0.8) / 2)


def test_clip_higher_dual_clip_and_truncated_importance_sampling():
    # clip_high 0.6: ratio 1.5 is inside [0.8, 1.6]: -1.5; token 1 still -0.5
    assert _loss(1.0, clip_high=0.6)[0].item() == pytest.approx((-1.5 - 0.5) / 2)
    # dual clip 1.4 with A=-1 caps token 0's 1.5 at 1.4
    loss, m, _ = _loss(-1.0, dual_clip=1.4)
    assert loss.item() == pytest.approx((1.4 + 0.8) / 2) and m["dual_clip_frac"] == 0.5
    # behaviour log-probs giving exp(old - behaviour) = 2, 0.5, 1, capped at 1.5
    behavior = -torch.log(torch.tensor([[2.0, 0.5, 1.0]]))
    loss, m, _ = _loss(1.0, tis_cap=1.5, behavior=behavior)
    assert loss.item() == pytest.approx((-1.2 * 1.5 - 0.5 * 0.5) / 2)
    with pytest.raises(ValueError, match="dual_clip"):
        _loss(-1.0, dual_clip=0.5)


def test_aggregations_by_hand():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])  # the last row has no policy token
    assert aggregate(loss, mask, "token-mean").item() == pytest.approx(7 / 3)
    assert aggregate(loss, mask, "seq-mean-token-sum").item() == pytest.approx((3 + 4) / 2)
    assert aggregate(loss, mask, "seq-mean-token-mean").item() == pytest.approx((1.5 + 4) / 2)
    # Dr. GRPO as veRL computes it: the mean of the sequence sums (3 and 4), over T = 3
    assert aggregate(loss, mask, "seq-mean-token-sum-norm").item() == pytest.approx(3.5 / 3)
    assert aggregate(loss, mask, "seq-mean-token-sum-norm", norm_tokens=7).item() == 0.5
    with pytest.raises(KeyError, match="token-mean"):
        aggregate(loss, mask, "mean")


def test_seq_mean_token_sum_norm_does_not_grow_with_the_batch():
    """B = 4 sequences of sums 2, 4, 6, 8 over T = 4: veRL (and Dr. GRPO) give mean(sums) / T
    = 5 / 4; a sum over all tokens / T would give 20 / 4, B times more. Doubling the batch
    with copies of the same sequences leaves the loss (and its gradient per token) unchanged."""
    loss = torch.tensor([[1.0, 1.0, 0.0, 0.0], [2.0, 2.0, 0.0, 0.0], [3.0, 3.0, 0, 0], [4.0] * 4])
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 0, 0]])
    agg = "seq-mean-token-sum-norm"
    assert aggregate(loss, mask, agg).item() == pytest.approx(5 / 4)
    assert aggregate(loss, mask, agg).item() != pytest.approx(20 / 4)
    doubled = aggregate(torch.cat([loss, loss]), torch.cat([mask, mask]), agg)
    assert doubled.item() == pytest.approx(5 / 4)
    # it is seq-mean-token-sum over the constant, whatever the padded width
    assert aggregate(loss, mask, agg, norm_tokens=10).item() == pytest.approx(
        aggregate(loss, mask, "seq-mean-token-sum").item() / 10
    )
    x = loss.clone().requires_grad_(True)
    aggregate(x, mask, agg).backward()
    assert torch.allclose(x.grad, mask / (4 * 4))  # d/dx = mask / (B T)


def test_the_ppo_log_ratio_is_clamped_so_a_pathological_ratio_stays_finite():
    """veRL clamps log(pi/pi_old) to [-20, 20] before exp. A token whose log-ratio is 200
    (exp overflows float32 to inf) gives a finite loss: with A < 0 the unclipped branch
    -A * e^20 wins, so the loss is e^20 / 2 over the 2 policy tokens, not inf or NaN."""
    logp = torch.tensor([[200.0, 0.0]], requires_grad=True)
    inp = PolicyLossInput(logp, torch.zeros(1, 2), torch.tensor([-1.0]), torch.ones(1, 2))
    loss, _ = ppo_clip(inp, ClipConfig())
    assert torch.isfinite(loss) and loss.item() == pytest.approx((math.exp(20) + 1.0) / 2)
    loss.backward()
    assert torch.isfinite(logp.grad).all()
    assert logp.grad[0, 0].item() == 0.0  # past the clamp: no gradient, as in veRL
    # an ordinary ratio is untouched: the clamp changes nothing inside [-20, 20]
    inside = PolicyLossInput(
        torch.tensor([[19.0]]), torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1)
    )
    assert ppo_clip(inside, ClipConfig())[0].item() == pytest.approx(math.exp(19), rel=1e-5)


def test_low_var_kl_is_k3_clamped_as_in_verl():
    logp, ref = torch.log(torch.tensor([0.5])), torch.log(torch.tensor([0.25]))
    assert kl("low_var_kl", logp, ref).item() == pytest.approx(kl("k3", logp, ref).item())
    # d = ref - logp = 3: k3 = e^3 - 1 - 3 = 16.09 > 10, so the estimate is clamped to 10
    lp = torch.tensor([-4.0], requires_grad=True)
    far = kl("low_var_kl", lp, torch.tensor([-1.0]))
    assert kl("k3", lp, torch.tensor([-1.0])).item() == pytest.approx(math.exp(3) - 4)
    assert far.item() == 10.0
    far.backward()
    assert lp.grad.item() == 0.0  # clamped: no gradient
    # d = -30: the log-ratio clamp (-20) applies first: e^-20 - 1 + 20 = 19.0 -> clamped 10
    assert kl("low_var_kl", torch.tensor([0.0]), torch.tensor([-30.0])).item() == 10.0
    # d = -5: inside both bounds, k3 itself: e^-5 - 1 + 5
    assert kl("low_var_kl", torch.tensor([0.0]), torch.tensor([-5.0])).item() == pytest.approx(
        math.exp(-5) + 4
    )
    # k3 without the clamps overflows where low_var_kl stays finite
    assert not torch.isfinite(kl("k3", torch.tensor([0.0]), torch.tensor([100.0]))).all()
    assert kl("low_var_kl", torch.tensor([0.0]), torch.tensor([100.0])).item() == 10.0


def test_kl_estimators_by_hand():
    logp, ref = torch.log(torch.tensor([0.5])), torch.log(torch.tensor([0.25]))
    # d = ref - logp = ln 0.5
    assert kl("k1", logp, ref).item() == pytest.approx(math.log(2))
    assert kl("k2", logp, ref).item() == pytest.approx(0.5 * math.log(2) ** 2)
    assert kl("k3", logp, ref).item() == pytest.approx(0.5 - 1 + math.log(2))
    same = kl("k3", logp, logp)
    assert same.item() == 0.0 and kl("k2", logp, logp).item() == 0.0
    with pytest.raises(KeyError, match="low_var_kl"):
        kl("k4", logp, ref)


# Masked importance sampling and the sampler-learner gap. Three sequences with the learner's
# log-probs equal to the old ones (ratio 1: nothing clipped), so each policy token's loss is
# -A; the advantages are per token, powers of two, so every sum below names its tokens.
# The sampler ratios r = exp(old - behaviour):
#   row 0: 1, 3, 0.4      (product 1.2, geometric mean 1.2^(1/3) = 1.06)
#   row 1: 1.9, 1.9, [100 on a non-policy token, ignored]  (product 3.61, geometric 1.9)
#   row 2: 0.45 x 3       (product 0.091, geometric 0.45)
# With the default range [0.5, 2]: token drops row 0's tokens 2 and 3 and all of row 2;
# sequence drops rows 1 and 2; geometric drops row 2 only.
IS_ADV = torch.tensor([[1.0, 2.0, 4.0], [8.0, 16.0, 32.0], [64.0, 128.0, 256.0]])
IS_MASK = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1]])
IS_RATIOS = torch.tensor([[1.0, 3.0, 0.4], [1.9, 1.9, 100.0], [0.45, 0.45, 0.45]])
IS_BEHAVIOR = -torch.log(IS_RATIOS)  # old = 0, so old - behaviour = log r
IS_POLICY = 8  # policy tokens


def _is_loss(behavior=IS_BEHAVIOR, **cfg):
    logp = torch.zeros(3, 3, requires_grad=True)
    inp = PolicyLossInput(logp, torch.zeros(3, 3), IS_ADV, IS_MASK, behavior)
    loss, metrics = ppo_clip(inp, ClipConfig(**cfg))
    return loss, metrics, logp


@pytest.mark.parametrize(
    ("level", "kept_sum", "dropped"),
    [
        ("token", 1 + 8 + 16, 5),  # row 0's first token, row 1's two
        ("sequence", 1 + 2 + 4, 5),  # row 0 only
        ("geometric", 1 + 2 + 4 + 8 + 16, 3),  # rows 0 and 1
    ],
)
def test_masked_importance_sampling_drops_exactly_the_out_of_range_tokens(level, kept_sum, dropped):
    plain, _, _ = _is_loss()
    assert plain.item() == pytest.approx(-(1 + 2 + 4 + 8 + 16 + 64 + 128 + 256) / IS_POLICY)
    loss, m, logp = _is_loss(is_mask=level)
    # dropped tokens still count in token-mean's denominator: all 8 policy tokens
    assert loss.item() == pytest.approx(-kept_sum / IS_POLICY)
    assert m["is_masked_frac"] == pytest.approx(dropped / IS_POLICY)
    loss.backward()
    # the gradient flows through kept tokens only: d(-A r / 8)/dlogp = -A / 8 at r = 1
    kept = torch.where(logp.grad != 0, IS_ADV, 0.0)
    assert kept.sum().item() == pytest.approx(kept_sum)
    assert torch.allclose(logp.grad, -kept / IS_POLICY)


def test_a_masked_sequence_still_counts_among_the_sequences():
    # sequence level keeps row 0 only: its token mean -7/3, over 3 sequences (not 1)
    loss, _, _ = _is_loss(is_mask="sequence", agg="seq-mean-token-mean")
    assert loss.item() == pytest.approx((-7 / 3) / 3)
    # a narrower range, [0.95, 1.05], drops every row (row 0's product, 1.2, too)
    loss, m, _ = _is_loss(is_mask="sequence", is_mask_low=0.95, is_mask_high=1.05)
    assert loss.item() == 0.0 and m["is_masked_frac"] == 1.0
    # a wider one keeps row 1 too (product 3.61 <= 4)
    loss, _, _ = _is_loss(is_mask="sequence", is_mask_high=4.0)
    assert loss.item() == pytest.approx(-(1 + 2 + 4 + 8 + 16) / IS_POLICY)


def test_the_mask_composes_with_truncated_importance_sampling():
    # token mask keeps row 0's first token (r = 1) and row 1's two (r = 1.9, capped at 1.5)
    loss, m, _ = _is_loss(is_mask="token", tis_cap=1.5)
    assert loss.item() == pytest.approx(-(1 * 1.0 + (8 + 16) * 1.5) / IS_POLICY)
    assert m["is_masked_frac"] == pytest.approx(5 / IS_POLICY)
    # TIS alone weighs every token, the out-of-range ones included
    loss, m, _ = _is_loss(tis_cap=1.5)
    tis = 1 * 1.0 + 2 * 1.5 + 4 * 0.4 + (8 + 16) * 1.5 + (64 + 128 + 256) * 0.45
    assert loss.item() == pytest.approx(-tis / IS_POLICY)
    assert "is_masked_frac" not in m
    assert m["is_ratio_max"] == pytest.approx(3.0)  # the non-policy token's 100 is not counted


def test_the_sampler_learner_gap_metrics_by_hand():
    d = [0.0, math.log(3), math.log(0.4), math.log(1.9), math.log(1.9)] + [math.log(0.45)] * 3
    _, m, _ = _is_loss(tis_cap=None)  # measured whatever the IS settings
    assert m["logprob_gap_mean"] == pytest.approx(sum(abs(x) for x in d) / IS_POLICY)
    assert m["logprob_gap_max"] == pytest.approx(math.log(3))  # not the masked token's ln 100
    # k3 of KL(sampler || learner): E_sampler[r - 1 - ln r], r = pi_learner / pi_sampler
    k3 = sum(math.exp(x) - 1 - x for x in d) / IS_POLICY
    assert m["sampler_kl"] == pytest.approx(k3)
    # sampler and learner agree: no gap
    _, same, _ = _is_loss(behavior=torch.zeros(3, 3), is_mask="token")
    assert same["logprob_gap_mean"] == same["logprob_gap_max"] == same["sampler_kl"] == 0.0
    assert same["is_masked_frac"] == 0.0


def test_without_behaviour_log_probs_there_is_no_gap_and_no_mask():
    plain, m_plain, _ = _is_loss(behavior=None)
    loss, m, _ = _is_loss(behavior=None, is_mask="token", tis_cap=1.5)
    assert loss.item() == plain.item()
    for key in ("logprob_gap_mean", "logprob_gap_max", "sampler_kl", "is_masked_frac"):
        assert key not in m and key not in m_plain, key


def test_bad_mask_settings_are_refused():
    with pytest.raises(ValueError, match="unknown is_mask 'seq'"):
        _is_loss(is_mask="seq")
    with pytest.raises(ValueError, match="is_mask_low < is_mask_high"):
        _is_loss(is_mask="token", is_mask_low=2.0, is_mask_high=2.0)
