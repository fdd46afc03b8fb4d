"""KL estimators between the policy and a reference, per token (Schulman 2020,
"Approximating KL Divergence", http://joschu.net/blog/kl-approx.html).

With ``d = logp_ref - logp`` (the log-ratio reference/policy at a token sampled from the
policy):

    k1 = -d                       unbiased, high variance, can be negative
    k2 = d^2 / 2                  biased, low variance, >= 0
    k3 = exp(d) - 1 - d           unbiased, low variance, >= 0  (the GRPO paper's choice)
    low_var_kl = clamp(k3 with d clamped to [-20, 20], -10, 10)      veRL's name and bounds

``low_var_kl`` is k3 made safe for a policy that has drifted far from the reference: d is
clamped before exponentiating (no inf) and the estimate is clamped to [-10, 10], so one token
whose probability collapsed cannot dominate the loss. Inside the bounds it equals k3 (value
and gradient); outside them its gradient is 0.

Use them as a loss term (aggregated over policy tokens like the policy loss) or as a
per-token reward penalty ``-beta * k``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

LOW_VAR_KL_LOG_RATIO_CLAMP = 20.0
LOW_VAR_KL_CLAMP = 10.0


def _low_var_kl(logp: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    d = (ref - logp).clamp(-LOW_VAR_KL_LOG_RATIO_CLAMP, LOW_VAR_KL_LOG_RATIO_CLAMP)
    return (torch.exp(d) - 1 - d).clamp(-LOW_VAR_KL_CLAMP, LOW_VAR_KL_CLAMP)


KL = {
    "k1": lambda logp, ref: logp - ref,
    "k2": lambda logp, ref: 0.5 * (ref - logp) ** 2,
    "k3": lambda logp, ref: torch.exp(ref - logp) - 1 - (ref - logp),
    "low_var_kl": _low_var_kl,
}


def kl(kind: str, logprobs_B_T: torch.Tensor, ref_logprobs_B_T: torch.Tensor) -> torch.Tensor:
    """Per-token KL estimate of the chosen kind."""
    fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = KL.get(kind)
    if fn is None:
        raise KeyError(f"unknown KL estimator {kind!r}; valid: {', '.join(KL)}")
    return fn(logprobs_B_T, ref_logprobs_B_T)


def kl_reward_penalty(
    kind: str,
    beta: float,
    logprobs_B_T: torch.Tensor,
    ref_logprobs_B_T: torch.Tensor,
    loss_mask_B_T: torch.Tensor,
) -> torch.Tensor:
    """``-beta * k`` on policy tokens, 0 elsewhere: a per-token reward shaping term."""
    return -beta * kl(kind, logprobs_B_T, ref_logprobs_B_T) * loss_mask_B_T
