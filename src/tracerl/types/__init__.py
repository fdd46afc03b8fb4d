"""The nouns of tracerl.

`trajectory` holds who wrote each token (`Source`, `Segment`, `Trajectory`); `episode` holds
how an episode ended and whose fault a failure was (`StopReason`, `Attribution`, `FaultKind`,
`Fault`, `Receipt`).
"""

from tracerl.types.episode import Attribution, Fault, FaultKind, Receipt, StopReason
from tracerl.types.reward import Layer, RewardBreakdown, RewardComponent, StepScore
from tracerl.types.trajectory import (
    SCHEMA,
    Segment,
    Source,
    ToolCall,
    Trajectory,
    TrajectoryError,
)

__all__ = [
    "SCHEMA",
    "Attribution",
    "Fault",
    "FaultKind",
    "Layer",
    "Receipt",
    "RewardBreakdown",
    "RewardComponent",
    "Segment",
    "Source",
    "StepScore",
    "StopReason",
    "ToolCall",
    "Trajectory",
    "TrajectoryError",
]
