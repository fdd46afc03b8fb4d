"""Training: batches from trajectories, memory-lean log-probs, the learner, a GRPO step,
and around them `tracerl train` (`loop`: synchronous, or `async_loop` with bounded
staleness), checkpoints and resume, SFT and the warm start (see docs/training.md).

The names below load torch when first used, not when the package is imported: a command
that stops at a mistake in its config (`train.resume`, `train.evaluation`'s checks) answers
in a second.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Batch": "tracerl.train.batch",
    "bucketed_batches": "tracerl.train.batch",
    "padded_batch": "tracerl.train.batch",
    "token_logprobs": "tracerl.train.logprobs",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'tracerl.train' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
