"""Policy losses: one typed input, ``(loss, metrics)`` out. Pure tensor math.

Shapes: ``_B`` sequences, ``_T`` tokens. Log-probs are per token, of the tokens actually in
the sequence; `loss_mask_B_T` is 1 exactly on policy tokens (straight from provenance).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

AGGREGATIONS = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)


def aggregate(
    loss_B_T: torch.Tensor, mask_B_T: torch.Tensor, mode: str, norm_tokens: int | None = None
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
    """
    m = mask_B_T.to(loss_B_T.dtype)
    masked = loss_B_T * m
    if mode == "token-mean":
        return masked.sum() / m.sum().clamp(min=1)
    per_seq = masked.sum(-1)
    has = m.sum(-1) > 0
    if not has.any() and mode in AGGREGATIONS:
        return masked.sum() * 0  # nothing to learn from, but still a graph to backward
    if mode == "seq-mean-token-sum":
        return per_seq[has].mean()
    if mode == "seq-mean-token-mean":
        return (per_seq[has] / m.sum(-1)[has]).mean()
    if mode == "seq-mean-token-sum-norm":
        return per_seq[has].mean() / (norm_tokens or loss_B_T.shape[-1])
    raise KeyError(f"unknown aggregation {mode!r}; valid: {', '.join(AGGREGATIONS)}")


@dataclass(frozen=True)
class PolicyLossInput:
    """Attributes:
    logprobs_B_T: the policy being updated (requires grad).
    old_logprobs_B_T: the policy before this update (the PPO ratio's denominator).
    advantages_B: one advantage per sequence (or ``_B_T``: one per token).
    loss_mask_B_T: 1 on policy tokens.
    behavior_logprobs_B_T: the sampler's own log-probs, when the samples are off-policy
        (async rollouts, a different engine): used for truncated importance sampling.
    """

    logprobs_B_T: torch.Tensor
    old_logprobs_B_T: torch.Tensor
    advantages_B: torch.Tensor
    loss_mask_B_T: torch.Tensor
    behavior_logprobs_B_T: torch.Tensor | None = None


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
    agg: how per-token losses are reduced (see `aggregate`).
    norm_tokens: the constant T of ``seq-mean-token-sum-norm`` (None: the padded length).
    """

    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    tis_cap: float | None = None
    agg: str = "token-mean"
    norm_tokens: int | None = None


LOG_RATIO_CLAMP = 20.0
"""The PPO log-ratio is clamped to [-20, 20] before exponentiating, as veRL does: it changes
nothing for any sane ratio (e^20 ~ 5e8) and keeps a pathological one from becoming inf/NaN."""


def ppo_clip(inp: PolicyLossInput, cfg: ClipConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped surrogate (Schulman et al. 2017, arXiv:1707.06347), per token:

    r = exp(clamp(logp - logp_old, -20, 20))
    l = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))
    l = min(l, -c A)            for A < 0, with dual clip c
    l = l * min(exp(logp_old - logp_behaviour), tis_cap)   with truncated IS
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
    if cfg.tis_cap is not None and inp.behavior_logprobs_B_T is not None:
        raw = torch.exp(
            (inp.old_logprobs_B_T - inp.behavior_logprobs_B_T).clamp(max=LOG_RATIO_CLAMP)
        )
        w = raw.clamp(max=cfg.tis_cap)
        loss = loss * w.detach()
        metrics["tis_weight_mean"] = float((w * mask).sum() / n)
        # the behaviour policy's distance from the proximal one, before the cap
        metrics["is_ratio_mean"] = float((raw * mask).sum() / n)
        metrics["is_ratio_max"] = float((raw * mask).max())
        metrics["tis_capped_frac"] = float(((raw > cfg.tis_cap).to(mask.dtype) * mask).sum() / n)
    with torch.no_grad():
        log_r = log_ratio
        metrics["ratio_mean"] = float((ratio * mask).sum() / n)
        metrics["approx_kl"] = float(((torch.exp(-log_r) - 1 + log_r) * mask).sum() / n)
    return aggregate(loss, mask, cfg.agg, cfg.norm_tokens), metrics


PolicyLoss = Callable[[PolicyLossInput, ClipConfig], tuple[torch.Tensor, dict[str, float]]]
POLICY_LOSSES: dict[str, PolicyLoss] = {"ppo_clip": ppo_clip}
