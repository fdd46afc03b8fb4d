"""tracerl: rollout engineering you can trust for RL on tool-using LLM agents.

The public API is this short list; everything else is reachable from its module.
"""

__version__ = "0.1.0"

from tracerl.jsonl import read_trajectories, write_trajectories
from tracerl.types import (
    Attribution,
    FaultKind,
    Receipt,
    Segment,
    Source,
    StopReason,
    ToolCall,
    Trajectory,
    TrajectoryError,
)

# Lazy names: importing tracerl must not import torch/transformers (or the env registry).
_LAZY = {
    "load": "tracerl.models",
    "ChatRenderer": "tracerl.models",
    "Conversation": "tracerl.models",
    "PolicyBundle": "tracerl.models",
    "make": "tracerl.envs",
    "check_env": "tracerl.rollout.env_check",
    "tool": "tracerl.envs",
    "ToolEnv": "tracerl.envs",
    "FaultInjector": "tracerl.envs",
    "Policy": "tracerl.rollout.runner",
    "run_episode": "tracerl.rollout.runner",
    "run_group": "tracerl.rollout.groups",
    "run_groups": "tracerl.rollout.groups",
    "RolloutConfig": "tracerl.rollout.budget",
    "Budgets": "tracerl.rollout.budget",
    "TerminalReserve": "tracerl.rollout.budget",
    "EpisodeWriter": "tracerl.rollout.persist",
    "Run": "tracerl.train.api",
    "TrainResult": "tracerl.train.api",
}
_MODULES = {"train": "tracerl.train"}
"""Lazy names that are modules: ``tracerl.train`` is the training package, and calling it
trains (`tracerl.train.api.train`); it would replace a function of that name here as soon as
one of its modules was imported."""

__all__ = [
    "Attribution",
    "FaultKind",
    "Receipt",
    "Segment",
    "Source",
    "StopReason",
    "ToolCall",
    "Trajectory",
    "TrajectoryError",
    "__version__",
    "read_trajectories",
    "write_trajectories",
    *_LAZY,
    *_MODULES,
]


def __getattr__(name: str):
    import importlib

    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _MODULES:
        return importlib.import_module(_MODULES[name])
    raise AttributeError(f"module 'tracerl' has no attribute {name!r}")
