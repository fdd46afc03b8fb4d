"""Sampling and (in later stages) the episode runner."""

from tracerl.rollout.sampler import HFSampler, Sampler, SampleResult, ScriptedSampler

__all__ = ["HFSampler", "SampleResult", "Sampler", "ScriptedSampler"]
