"""A learning rate that slows with staleness: ``lr_eff = lr * f(s)`` for a sample drawn by a
policy `s` versions older than the one being updated.

    off          f(s) = 1
    inverse      f(s) = 1 / (1 + alpha * s)
    exponential  f(s) = gamma ** s

How it is applied, and why in two parts: Adam (and AdamW) divide each step by a running
estimate of the gradient's scale, so multiplying a whole batch's loss by a constant changes
almost nothing — a loss weight alone cannot slow the step. The batch's mean factor therefore
scales the optimizer's learning rate for that update, and each sample's loss is weighted by
its factor relative to that mean (weights average 1). A batch of equally stale samples then
steps at exactly ``lr * f(s)``; in a mixed batch older samples also count for less than
fresh ones. The relative weights multiply the advantages, which for the clipped PPO
objective equals weighting the sample's loss (a positive factor commutes with the clip).
"""

from __future__ import annotations

from collections.abc import Sequence


def staleness_factor(
    s: int, kind: str = "inverse", alpha: float = 0.5, gamma: float = 0.7
) -> float:
    if s < 0:
        raise ValueError(f"staleness is a count of versions, >= 0; got {s}")
    if kind == "off":
        return 1.0
    if kind == "inverse":
        return 1.0 / (1.0 + alpha * s)
    if kind == "exponential":
        return gamma**s
    raise ValueError(f"unknown staleness schedule {kind!r}; valid: off, inverse, exponential")


def staleness_scales(
    staleness: Sequence[int], kind: str = "inverse", alpha: float = 0.5, gamma: float = 0.7
) -> tuple[float, list[float]]:
    """(the update's learning-rate scale, each sample's relative loss weight)."""
    if not staleness:
        return 1.0, []
    f = [staleness_factor(s, kind, alpha, gamma) for s in staleness]
    scale = sum(f) / len(f)
    return scale, [x / scale for x in f]
