"""Rewards: answer checks, the citation chain, and layered composition from YAML.

`algos/`-style purity: nothing here imports asyncio, HTTP clients or loggers.
"""

from tracerl.rewards import components as _components  # noqa: F401 - registers components
from tracerl.rewards.components import SEARCH_REWARD
from tracerl.rewards.compose import (
    COMPONENTS,
    ComponentSpec,
    RewardContext,
    RewardSpec,
    Score,
    component,
    compose,
)
from tracerl.rewards.judge import component as _judge  # noqa: F401 - registers judge
from tracerl.rewards.qa import exact_match, f1, normalize, sub_exact_match, verify_citation

__all__ = [
    "COMPONENTS",
    "SEARCH_REWARD",
    "ComponentSpec",
    "RewardContext",
    "RewardSpec",
    "Score",
    "component",
    "compose",
    "exact_match",
    "f1",
    "normalize",
    "sub_exact_match",
    "verify_citation",
]
