"""Training: batches from trajectories, memory-lean log-probs, the learner, a GRPO step,
and around them `tracerl train` (`loop`: synchronous, or `async_loop` with bounded
staleness), checkpoints and resume, SFT and the warm start (see docs/training.md).

The names below load torch when first used, not when the package is imported: a command
that stops at a mistake in its config (`train.resume`, `train.evaluation`'s checks) answers
in a second.

The package is callable: ``tracerl.train(config, env=..., reward=..., **sections)`` is
`tracerl.train.api.train` (docs/api.md). A function named ``train`` in ``tracerl`` would be
replaced by this package as soon as any of its modules is imported (the import system sets
the attribute), so the package itself answers the call, imported first or not.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from tracerl.imports import lazy_names

_EXPORTS = {
    "Batch": "tracerl.train.batch",
    "bucketed_batches": "tracerl.train.batch",
    "padded_batch": "tracerl.train.batch",
    "token_logprobs": "tracerl.train.logprobs",
}
__all__ = list(_EXPORTS)


__getattr__ = lazy_names(__name__, _EXPORTS)


class _CallableModule(types.ModuleType):
    """This package's class: calling it trains (`tracerl.train.api.train`)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from tracerl.train.api import train

        return train(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
