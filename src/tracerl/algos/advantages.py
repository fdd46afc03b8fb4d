"""Advantage estimators for outcome rewards: one signature, registered by name.

    advantages_B = fn(rewards_B, group_B, eligible_B)

`rewards_B` is one scalar reward per episode, `group_B` the group (task) index of each
episode, `eligible_B` whether it may enter the policy gradient (see
`tracerl.rewards.eligibility`). Ineligible episodes get advantage 0 and never enter a group's
statistics; a group with fewer than two eligible members gets 0 everywhere (it has no
baseline). Pure tensor math: no I/O, no logging.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

AdvantageFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
ADVANTAGES: dict[str, AdvantageFn] = {}


def register(name: str) -> Callable[[AdvantageFn], AdvantageFn]:
    def add(fn: AdvantageFn) -> AdvantageFn:
        if name in ADVANTAGES:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        ADVANTAGES[name] = fn
        return fn

    return add


def get(name: str) -> AdvantageFn:
    if name not in ADVANTAGES:
        raise KeyError(f"unknown advantage estimator {name!r}; valid: {', '.join(ADVANTAGES)}")
    return ADVANTAGES[name]


def _group_stats(
    rewards_B: torch.Tensor, group_B: torch.Tensor, eligible_B: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per episode: its group's eligible count, mean and unbiased std (0 when undefined)."""
    r = rewards_B.float()
    e = eligible_B.bool()
    n_B = torch.zeros_like(r)
    mean_B = torch.zeros_like(r)
    std_B = torch.zeros_like(r)
    for g in torch.unique(group_B):
        members = group_B == g
        vals = r[members & e]
        n = vals.numel()
        n_B[members] = n
        if n:
            mean_B[members] = vals.mean()
        if n > 1:
            std_B[members] = vals.std(correction=1)
    return n_B, mean_B, std_B


def _keep(adv_B: torch.Tensor, n_B: torch.Tensor, eligible_B: torch.Tensor) -> torch.Tensor:
    return torch.where(eligible_B.bool() & (n_B >= 2), adv_B, torch.zeros_like(adv_B))


@register("grpo")
def grpo(
    rewards_B: torch.Tensor, group_B: torch.Tensor, eligible_B: torch.Tensor, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300):

        A_i = (r_i - mean_G(r)) / (std_G(r) + eps)

    with the unbiased group standard deviation. A group whose eligible rewards are all equal
    has std 0 and numerator 0: its advantages are 0 (it teaches nothing), not NaN.
    """
    n_B, mean_B, std_B = _group_stats(rewards_B, group_B, eligible_B)
    return _keep((rewards_B.float() - mean_B) / (std_B + eps), n_B, eligible_B)


@register("dr_grpo")
def dr_grpo(
    rewards_B: torch.Tensor, group_B: torch.Tensor, eligible_B: torch.Tensor
) -> torch.Tensor:
    """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv:2503.20783):
    the group mean as baseline, no division by the std (which biases toward easy and hard
    questions):  A_i = r_i - mean_G(r)."""
    n_B, mean_B, _ = _group_stats(rewards_B, group_B, eligible_B)
    return _keep(rewards_B.float() - mean_B, n_B, eligible_B)


@register("rloo")
def rloo(rewards_B: torch.Tensor, group_B: torch.Tensor, eligible_B: torch.Tensor) -> torch.Tensor:
    """RLOO (Ahmadian et al. 2024, "Back to Basics", arXiv:2402.14740): the leave-one-out
    mean of the other members as baseline:

        A_i = r_i - (1 / (n - 1)) * sum_{j != i} r_j = n / (n - 1) * (r_i - mean_G(r))
    """
    n_B, mean_B, _ = _group_stats(rewards_B, group_B, eligible_B)
    scale = n_B / (n_B - 1).clamp(min=1)
    return _keep(scale * (rewards_B.float() - mean_B), n_B, eligible_B)


@register("reinforce_pp_baseline")
def reinforce_pp_baseline(
    rewards_B: torch.Tensor, group_B: torch.Tensor, eligible_B: torch.Tensor, eps: float = 1e-6
) -> torch.Tensor:
    """REINFORCE++ with a group baseline (Hu 2025, arXiv:2501.03262): subtract the group
    mean, then whiten across the whole batch (its eligible episodes):

        a_i = r_i - mean_G(r);   A_i = (a_i - mean_B(a)) / (std_B(a) + eps)
    """
    n_B, mean_B, _ = _group_stats(rewards_B, group_B, eligible_B)
    a = _keep(rewards_B.float() - mean_B, n_B, eligible_B)
    used = eligible_B.bool() & (n_B >= 2)
    if used.sum() < 2:
        return torch.zeros_like(a)
    mu, sd = a[used].mean(), a[used].std(correction=1)
    return torch.where(used, (a - mu) / (sd + eps), torch.zeros_like(a))
