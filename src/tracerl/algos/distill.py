"""On-policy distillation's per-token signal (docs/distillation.md).

The student sampled token y_t from pi_S(. | y_<t); the teacher's log-prob of the same token
in the same context is log pi_T(y_t | y_<t). Their difference is a one-sample estimate of
the per-token reverse KL, KL(pi_S || pi_T) at step t (unbiased, since y_t ~ pi_S):

    kl_t = log pi_S(y_t) - log pi_T(y_t),      A_teacher_t = -kl_t

and the advantage a policy token trains with is

    A_t = outcome_weight * A_outcome(_t) + distill_weight * A_teacher_t

Only policy tokens (the loss mask) get a teacher term; every other position is 0 here and
never reaches the loss anyway. Plain lists: one trajectory's tokens.
"""

from __future__ import annotations

from collections.abc import Sequence


def teacher_advantages(
    student: Sequence[float], teacher: Sequence[float], mask: Sequence[int]
) -> list[float]:
    """``log p_teacher - log p_student`` on the policy tokens (`mask`), 0 elsewhere."""
    if not len(student) == len(teacher) == len(mask):
        raise ValueError(
            f"teacher_advantages: {len(student)} student, {len(teacher)} teacher log-probs "
            f"and {len(mask)} mask bits: one each per token"
        )
    return [t - s if m else 0.0 for s, t, m in zip(student, teacher, mask, strict=True)]


def mix(
    outcome: float | Sequence[float],
    teacher: Sequence[float],
    mask: Sequence[int],
    outcome_weight: float,
    distill_weight: float,
) -> list[float]:
    """Per token: ``outcome_weight * outcome + distill_weight * teacher`` on policy tokens, 0
    elsewhere. `outcome`: the sample's advantage (one number), or one per token (turn-level
    credit)."""
    per_token = [float(outcome)] * len(mask) if isinstance(outcome, int | float) else outcome
    if len(per_token) != len(mask) or len(teacher) != len(mask):
        raise ValueError("mix: the outcome, teacher and mask must cover the same tokens")
    return [
        outcome_weight * o + distill_weight * a if m else 0.0
        for o, a, m in zip(per_token, teacher, mask, strict=True)
    ]


def turn_spans(mask: Sequence[int]) -> list[tuple[int, int]]:
    """The policy turns of a trajectory: each maximal run of policy tokens, ``(start, end)``
    (a turn ends where template or environment tokens begin)."""
    spans, start = [], None
    for i, m in enumerate(mask):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    if start is not None:
        spans.append((start, len(mask)))
    return spans
