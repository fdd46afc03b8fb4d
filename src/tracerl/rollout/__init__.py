"""Rollouts: the samplers, the episode runner and what runs groups of episodes.

The samplers are named here lazily (PEP 562): a config, which reads this package's
settings (`tracerl.rollout.budget`, `tracerl.rollout.backend_config`), loads without torch,
so a mistake in one is reported before the model stack is imported."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_WHERE = {
    "BatchedHFSampler": "tracerl.rollout.batched",
    "HFSampler": "tracerl.rollout.sampler",
    "SampleRequest": "tracerl.rollout.sampler",
    "SampleResult": "tracerl.rollout.sampler",
    "Sampler": "tracerl.rollout.sampler",
    "ScriptedSampler": "tracerl.rollout.sampler",
}

__all__ = [
    "BatchedHFSampler",
    "HFSampler",
    "SampleRequest",
    "SampleResult",
    "Sampler",
    "ScriptedSampler",
]

if TYPE_CHECKING:
    from tracerl.rollout.batched import BatchedHFSampler
    from tracerl.rollout.sampler import (
        HFSampler,
        Sampler,
        SampleRequest,
        SampleResult,
        ScriptedSampler,
    )


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'tracerl.rollout' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value  # once
    return value
