"""The precision settings' names, and which of them go together: plain strings, no torch, so
a config is checked before the model stack loads. What they mean is `tracerl.models.placement`'s."""

from __future__ import annotations

PRECISIONS = ("auto", "fp32", "bf16-mixed", "bf16")


def precision_conflict(dtype: str, precision: str) -> str | None:
    """Why ``model.dtype`` and ``trainer.precision`` cannot go together (None: they can)."""
    if precision not in PRECISIONS:
        return f"trainer.precision: {precision!r} is not one of {', '.join(PRECISIONS)}"
    if dtype == "float32" and precision in ("bf16-mixed", "bf16"):
        return (
            f"model.dtype=float32 computes in fp32 but trainer.precision={precision} computes "
            "in bf16: set model.dtype=auto (or bfloat16), or trainer.precision=fp32"
        )
    if dtype == "bfloat16" and precision == "fp32":
        return (
            "model.dtype=bfloat16 computes in bf16 but trainer.precision=fp32 computes in "
            "fp32: set model.dtype=auto (or float32), or trainer.precision=bf16-mixed"
        )
    return None
