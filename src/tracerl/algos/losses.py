"""Policy losses: one typed input, ``(loss, metrics)`` out. Pure tensor math.

Shapes: ``_B`` sequences, ``_T`` tokens. Log-probs are per token, of the tokens actually in
the sequence; `loss_mask_B_T` is 1 exactly on policy tokens (straight from provenance).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

IS_MASK_LEVELS = ("token", "sequence", "geometric")

AGGREGATIONS = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)


def aggregate(
    loss_B_T: torch.Tensor,
    mask_B_T: torch.Tensor,
    mode: str,
    norm_tokens: int | None = None,
    weights_B: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss over policy tokens.

    * ``token-mean``: sum over all policy tokens / their count (every token weighs the same;
      long answers weigh more — DAPO's choice);
    * ``seq-mean-token-sum``: mean over sequences of each sequence's token sum;
    * ``seq-mean-token-mean``: mean over sequences of each sequence's token mean (the original
      GRPO; every sequence weighs the same, whatever its length);
    * ``seq-mean-token-sum-norm``: mean over sequences of each sequence's token sum, divided
      by a constant (`norm_tokens`, default the padded length T) — Dr. GRPO's length-unbiased
      form (Liu et al. 2025, arXiv:2503.20783), as veRL computes it: the same loss as
      ``seq-mean-token-sum`` scaled by 1/T, so its size does not grow with the number of
      sequences in the batch.

    Sequences without policy tokens are skipped by the sequence means (they count neither in
    the numerator nor in the number of sequences).

    `weights_B` (one per sequence, default 1) weighs sequences inside each mode, exactly:
    the token mean becomes sum(w l) / sum(w) over tokens, a sequence mean becomes
    sum(w_s l_s) / sum(w_s) over sequences. With every sample of an episode of n samples
    weighted 1/n (``trainer.sample_weighting: episode``), the episode weighs what a
    one-sample episode weighs under the sequence means; under ``token-mean`` it weighs its
    samples' mean length.
    """
    m = mask_B_T.to(loss_B_T.dtype)
    if weights_B is not None:
        m = m * weights_B.to(loss_B_T)[:, None]  # weighted tokens; counts from the mask
    masked = loss_B_T * m
    if mode == "token-mean":
        return masked.sum() / m.sum().clamp(min=1e-12) if m.sum() > 0 else masked.sum() * 0
    count = mask_B_T.to(loss_B_T.dtype).sum(-1)
    has = count > 0
    if not has.any() and mode in AGGREGATIONS:
        return masked.sum() * 0  # nothing to learn from, but still a graph to backward
    w = (weights_B.to(loss_B_T) if weights_B is not None else torch.ones_like(count))[has]
    per_seq = (loss_B_T * mask_B_T.to(loss_B_T.dtype)).sum(-1)[has]
    if mode == "seq-mean-token-sum":
        return (w * per_seq).sum() / w.sum()
    if mode == "seq-mean-token-mean":
        return (w * per_seq / count[has]).sum() / w.sum()
    if mode == "seq-mean-token-sum-norm":
        return (w * per_seq).sum() / w.sum() / (norm_tokens or loss_B_T.shape[-1])
    raise KeyError(f"unknown aggregation {mode!r}; valid: {', '.join(AGGREGATIONS)}")


@dataclass(frozen=True)
class PolicyLossInput:
    """Attributes:
    logprobs_B_T: the policy being updated (requires grad).
    old_logprobs_B_T: the policy before this update (the PPO ratio's denominator).
    advantages_B: one advantage per sequence (or ``_B_T``: one per token).
    loss_mask_B_T: 1 on policy tokens.
    behavior_logprobs_B_T: the sampler's own log-probs, when the samples are off-policy
        (async rollouts, a different engine or dtype): used for truncated and masked
        importance sampling, and measured (the sampler-learner gap metrics).
    weights_B: each sequence's weight in the aggregation (see `aggregate`); None: 1 each.
    """

    logprobs_B_T: torch.Tensor
    old_logprobs_B_T: torch.Tensor
    advantages_B: torch.Tensor
    loss_mask_B_T: torch.Tensor
    behavior_logprobs_B_T: torch.Tensor | None = None
    weights_B: torch.Tensor | None = None


@dataclass(frozen=True)
class ClipConfig:
    """Attributes:
    clip_low, clip_high: the ratio is clipped to [1 - clip_low, 1 + clip_high]; a larger
        clip_high ("clip-higher", DAPO, arXiv:2503.14476) keeps exploration alive.
    dual_clip: c > 1 bounds the loss of negative-advantage tokens at -c * A (Ye et al. 2020,
        dual-clip PPO, arXiv:1912.09729); None disables it.
    tis_cap: truncated importance sampling for off-policy samples: each token's loss is
        weighted by min(exp(old - behaviour), tis_cap) (Yao et al. 2025, "Your Efficient RL
        Framework Secretly Brings You Off-Policy RL Training"); None disables it.
    is_mask: masked importance sampling (veRL's rollout correction with
        ``rollout_is_mode: mask``): policy tokens whose sampler-learner ratio
        r = exp(old - behaviour) is out of [is_mask_low, is_mask_high] are dropped from the
        loss. ``token``: each token on its own ratio; ``sequence``: a whole sequence on the
        product of its tokens' ratios; ``geometric``: a whole sequence on their geometric
        mean. None disables it. Composes with `tis_cap` (the truncated weight applies to the
        tokens kept).
    is_mask_low, is_mask_high: the kept range of the ratio (0 < low < high).
    agg: how per-token losses are reduced (see `aggregate`).
    norm_tokens: the constant T of ``seq-mean-token-sum-norm`` (None: the padded length).
    """

    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    tis_cap: float | None = None
    is_mask: str | None = None
    is_mask_low: float = 0.5
    is_mask_high: float = 2.0
    agg: str = "token-mean"
    norm_tokens: int | None = None


LOG_RATIO_CLAMP = 20.0
"""The PPO log-ratio is clamped to [-20, 20] before exponentiating, as veRL does: it changes
nothing for any sane ratio (e^20 ~ 5e8) and keeps a pathological one from becoming inf/NaN."""


def _is_keep(log_r_B_T: torch.Tensor, mask_B_T: torch.Tensor, cfg: ClipConfig) -> torch.Tensor:
    """1 where masked importance sampling keeps a token, 0 where it drops it, from the
    per-token log-ratios log(pi_old / pi_behaviour). Compared in log space, so a long
    sequence's product of ratios cannot overflow."""
    lo, hi = math.log(cfg.is_mask_low), math.log(cfg.is_mask_high)
    if cfg.is_mask == "token":
        stat = log_r_B_T
    else:
        per_seq = (log_r_B_T * mask_B_T).sum(-1, keepdim=True)  # log of the product
        if cfg.is_mask == "geometric":  # log of the geometric mean
            per_seq = per_seq / mask_B_T.sum(-1, keepdim=True).clamp(min=1)
        stat = per_seq.expand_as(log_r_B_T)
    return ((stat >= lo) & (stat <= hi)).to(mask_B_T.dtype)


def _check_is_mask(cfg: ClipConfig) -> None:
    if cfg.is_mask not in IS_MASK_LEVELS:
        raise ValueError(
            f"unknown is_mask {cfg.is_mask!r}; valid: {', '.join(IS_MASK_LEVELS)} (or None)"
        )
    if not 0 < cfg.is_mask_low < cfg.is_mask_high:
        raise ValueError(
            f"is_mask needs 0 < is_mask_low < is_mask_high, got {cfg.is_mask_low} and "
            f"{cfg.is_mask_high}"
        )


def ppo_clip(inp: PolicyLossInput, cfg: ClipConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped surrogate (Schulman et al. 2017, arXiv:1707.06347), per token:

    r = exp(clamp(logp - logp_old, -20, 20))
    l = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))
    l = min(l, -c A)            for A < 0, with dual clip c
    l = l * keep                with masked IS: 0 where the sampler ratio is out of range
    l = l * min(exp(logp_old - logp_behaviour), tis_cap)   with truncated IS

    With behaviour log-probs, the metrics also measure the sampler-learner gap over policy
    tokens, d = logp_old - logp_behaviour (whatever the IS settings): ``logprob_gap_mean``
    (mean |d|), ``logprob_gap_max`` (max |d|) and ``sampler_kl``, the k3 estimate of
    KL(sampler || learner) per token, exp(d) - 1 - d (Schulman's k3 for samples drawn from
    the sampler: r = pi_learner / pi_sampler, KL = E[r - 1 - log r]; d clamped to [-20, 20]).
    """
    mask = inp.loss_mask_B_T.to(inp.logprobs_B_T.dtype)
    adv = inp.advantages_B
    adv_B_T = adv[:, None].expand_as(inp.logprobs_B_T) if adv.dim() == 1 else adv
    log_ratio = (inp.logprobs_B_T - inp.old_logprobs_B_T).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = -adv_B_T * ratio
    clipped = -adv_B_T * ratio.clamp(1 - cfg.clip_low, 1 + cfg.clip_high)
    loss = torch.maximum(unclipped, clipped)
    metrics: dict[str, float] = {}
    n = mask.sum().clamp(min=1)
    metrics["clip_frac"] = float(((clipped > unclipped).to(mask.dtype) * mask).sum() / n)
    if cfg.dual_clip is not None:
        if cfg.dual_clip <= 1:
            raise ValueError(f"dual_clip must be > 1, got {cfg.dual_clip}")
        bound = -adv_B_T * cfg.dual_clip
        capped = (adv_B_T < 0) & (loss > bound)
        loss = torch.where(adv_B_T < 0, torch.minimum(loss, bound), loss)
        metrics["dual_clip_frac"] = float((capped.to(mask.dtype) * mask).sum() / n)
    if cfg.is_mask is not None:
        _check_is_mask(cfg)
    behavior = inp.behavior_logprobs_B_T
    if behavior is not None:
        with torch.no_grad():
            # log(pi_learner / pi_sampler) on policy tokens; 0 (ratio 1) elsewhere, whatever
            # filler the padding holds
            gap = torch.where(mask > 0, inp.old_logprobs_B_T - behavior, 0.0).detach()
            metrics.update(_gap_metrics(gap, mask, n))
        if cfg.is_mask is not None:
            keep = _is_keep(gap, mask, cfg)
            # A dropped token gets weight 0 but stays in the loss mask, so it still counts in
            # the aggregation's denominator (its token count, its sequence count). veRL takes
            # dropped tokens out of the response mask instead (out of the denominator too).
            # Kept in, the normaliser does not depend on which tokens the mask dropped: the
            # learner weighs each micro-batch by its share of the step's policy tokens
            # (sequences) before the loss sees the mask, and that weighting stays exact only
            # if each micro-batch's denominator is its unmasked one. It is also the plain
            # masked-IS estimator, sum(1[r in range] * loss) / N, with no data-dependent
            # rescaling of the surviving tokens.
            loss = loss * keep
            metrics["is_masked_frac"] = float(((1 - keep) * mask).sum() / n)
        if cfg.tis_cap is not None:
            raw = torch.exp(gap.clamp(max=LOG_RATIO_CLAMP))
            w = raw.clamp(max=cfg.tis_cap)
            loss = loss * w
            # over every policy token, masked or not
            metrics["tis_weight_mean"] = float((w * mask).sum() / n)
            # the behaviour policy's distance from the proximal one, before the cap
            metrics["is_ratio_mean"] = float((raw * mask).sum() / n)
            metrics["is_ratio_max"] = float((raw * mask).max())
            metrics["tis_capped_frac"] = float(
                ((raw > cfg.tis_cap).to(mask.dtype) * mask).sum() / n
            )
    with torch.no_grad():
        log_r = log_ratio
        metrics["ratio_mean"] = float((ratio * mask).sum() / n)
        metrics["approx_kl"] = float(((torch.exp(-log_r) - 1 + log_r) * mask).sum() / n)
    return aggregate(loss, mask, cfg.agg, cfg.norm_tokens, inp.weights_B), metrics


def _gap_metrics(
    gap_B_T: torch.Tensor, mask_B_T: torch.Tensor, n: torch.Tensor
) -> dict[str, float]:
    """How far the sampler's log-probs are from the learner's, over policy tokens (0 where
    there are none)."""
    d = gap_B_T.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    absd = gap_B_T.abs() * mask_B_T  # the caller zeroed the gap off the policy tokens
    return {
        "logprob_gap_mean": float(absd.sum() / n),
        "logprob_gap_max": float(absd.max()) if absd.numel() else 0.0,
        "sampler_kl": float(((torch.exp(d) - 1 - d) * mask_B_T).sum() / n),
    }


PolicyLoss = Callable[[PolicyLossInput, ClipConfig], tuple[torch.Tensor, dict[str, float]]]
POLICY_LOSSES: dict[str, PolicyLoss] = {"ppo_clip": ppo_clip}
