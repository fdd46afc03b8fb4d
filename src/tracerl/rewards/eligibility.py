"""Attribution into the gradient: which rewards may train the policy, and group baselines
computed over those only.

An episode's reward is eligible when the evaluator decided it and the policy owns the
outcome (or it succeeded despite a degraded environment). A group-relative baseline (the
mean reward of the group, as in GRPO) is computed over eligible members only — an outage in
one member must not shift the others' advantages — and a group with fewer than two eligible
members has no baseline at all: it is dropped and counted, never trained on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tracerl.types import RewardBreakdown


@dataclass(frozen=True)
class GroupBaseline:
    eligible_G: tuple[bool, ...]
    baseline: float | None  # None: the group is dropped
    advantages_G: tuple[float | None, ...]  # reward - baseline; None for ineligible members

    @property
    def dropped(self) -> bool:
        return self.baseline is None


def group_baseline(rewards_G: Sequence[RewardBreakdown], min_eligible: int = 2) -> GroupBaseline:
    eligible = tuple(r.eligible for r in rewards_G)
    totals = [r.total for r, ok in zip(rewards_G, eligible, strict=True) if ok]
    if len(totals) < min_eligible:
        return GroupBaseline(eligible, None, tuple(None for _ in rewards_G))
    baseline = sum(totals) / len(totals)
    advantages = tuple(
        r.total - baseline if ok else None for r, ok in zip(rewards_G, eligible, strict=True)
    )
    return GroupBaseline(eligible, baseline, advantages)


def baselines(
    groups: Sequence[Sequence[RewardBreakdown]], min_eligible: int = 2
) -> tuple[list[GroupBaseline], dict[str, float]]:
    """Baselines per group, and metrics: ``attribution/eligible_rate``,
    ``attribution/groups_dropped`` (a count) and ``attribution/groups_dropped_rate``."""
    out = [group_baseline(g, min_eligible) for g in groups]
    n_eps = sum(len(g) for g in groups) or 1
    dropped = sum(b.dropped for b in out)
    return out, {
        "attribution/eligible_rate": sum(sum(b.eligible_G) for b in out) / n_eps,
        "attribution/groups_dropped": float(dropped),
        "attribution/groups_dropped_rate": dropped / (len(out) or 1),
    }
