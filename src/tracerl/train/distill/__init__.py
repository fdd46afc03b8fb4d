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

__all__ = ["Distilled", "Distiller", "ModelTeacher", "Teacher", "build_distiller", "load_teacher"]


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
