"""tracerl: rollout engineering you can trust for RL on tool-using LLM agents.

The public API is this short list; everything else is reachable from its module.
"""

__version__ = "0.1.0"

from tracerl.jsonl import read_trajectories, write_trajectories
from tracerl.types import Segment, Source, ToolCall, Trajectory, TrajectoryError

__all__ = [
    "Segment",
    "Source",
    "ToolCall",
    "Trajectory",
    "TrajectoryError",
    "__version__",
    "read_trajectories",
    "write_trajectories",
]


def __getattr__(name: str):  # lazy: importing tracerl must not import torch/transformers
    if name in ("load", "ChatRenderer", "Conversation", "PolicyBundle"):
        from tracerl import models

        return getattr(models, name)
    raise AttributeError(f"module 'tracerl' has no attribute {name!r}")
