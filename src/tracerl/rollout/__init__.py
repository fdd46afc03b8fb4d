"""Rollouts: the samplers, the episode runner and what runs groups of episodes.

The samplers are named here lazily (PEP 562): a config, which reads this package's
settings (`tracerl.rollout.budget`, `tracerl.rollout.backend_config`), loads without torch,
so a mistake in one is reported before the model stack is imported."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracerl.imports import lazy_names

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


__getattr__ = lazy_names(__name__, _WHERE)
