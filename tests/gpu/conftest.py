"""The GPU tier: tracerl's commands and learner on CUDA (`make gpu-check` runs it).

Every test here is marked ``gpu``: without a CUDA GPU it is skipped (tests/conftest.py), so
CPU CI collects it and passes. ``TRACERL_GPU_TIER_ON_CPU=1`` runs the tier on the CPU
instead: the dry run of `benchmarks/gpu_check.sh` that proves its plumbing before GPU time is
spent on it.
"""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def gpu() -> str:
    """The device the tier runs on: cuda, or cpu in a dry run."""
    return "cpu" if os.environ.get("TRACERL_GPU_TIER_ON_CPU") == "1" else "cuda"
