"""On-policy distillation (``trainer.distill``, docs/distillation.md): a teacher grades every
policy token of the student's own episodes.

`build_distiller` makes the run's `Distiller` from its config; the update
(`tracerl.train.grpo.update_on_groups`) hands it the rows it is about to train on and trains
with the advantages it returns. The math is `tracerl.algos.distill`'s; the teachers are
`tracerl.train.distill.teachers` (in this process) and `tracerl.train.distill.server`."""

from __future__ import annotations

from typing import Any

from tracerl.train.distill.distiller import Distilled, Distiller
from tracerl.train.distill.teachers import Deferred, ModelTeacher, Teacher, load_teacher

__all__ = [
    "Deferred",
    "Distilled",
    "Distiller",
    "ModelTeacher",
    "Teacher",
    "build_distiller",
    "coverage_warning",
    "load_teacher",
]


def coverage_warning(step: int, metrics: dict[str, float]) -> str | None:
    """A line for the run's log when the step's teacher graded under half the policy tokens
    it was given (the rest were left out); None otherwise, or without a teacher."""
    covered = metrics.get("train/distill/coverage", 1.0)
    if covered >= 0.5:
        return None
    return (
        f"warning: step {step}: the teacher graded {covered:.0%} of the policy tokens (the "
        f"rest were left out: {metrics.get('train/distill/teacher_failures', 0):.0f} samples "
        f"failed, {metrics.get('train/distill/budget_refusals', 0):.0f} past its budget)"
    )


def build_distiller(cfg: Any, tokenizer: Any = None) -> Distiller | None:
    """The run's distiller (`cfg`: a `RunConfig`; `tokenizer`: the student's, which a server
    teacher's tokens are checked against), its teacher loaded when first asked; None
    without ``trainer.distill``."""
    d = cfg.trainer.distill
    if d is None:
        return None
    from tracerl.cache import cache_dir
    from tracerl.models.refs import parse_model_ref
    from tracerl.rewards.judge.judge import VerdictCache

    teacher: Teacher
    if d.teacher is not None:
        ref = parse_model_ref(d.teacher)
        m = cfg.model
        teacher = Deferred(
            lambda: load_teacher(ref, m.device, m.dtype, d.micro_batch_tokens), d.teacher
        )
    else:
        from tracerl.train.distill.server import ServerTeacher

        teacher = ServerTeacher.of(d.server, tokenizer)
    return Distiller(
        teacher,
        temperature=cfg.model.temperature,
        outcome_weight=d.outcome_weight,
        distill_weight=d.distill_weight,
        tokens_per_step=d.tokens_per_step,
        cache=VerdictCache(cache_dir() / "teacher") if d.cache else None,
    )
