"""Sampling and (in later stages) the episode runner."""

from tracerl.rollout.batched import BatchedHFSampler
from tracerl.rollout.sampler import (
    HFSampler,
    Sampler,
    SampleRequest,
    SampleResult,
    ScriptedSampler,
)

__all__ = [
    "BatchedHFSampler",
    "HFSampler",
    "SampleRequest",
    "SampleResult",
    "Sampler",
    "ScriptedSampler",
]
