"""Pure math: advantage estimators, policy losses, KL estimators, aggregations.

Nothing here imports asyncio, HTTP clients, loggers or the distributed runtime; every
function documents its formula and paper, and is tested against hand-computed numbers.
"""

from tracerl.algos.advantages import ADVANTAGES
from tracerl.algos.kl import KL, kl, kl_reward_penalty
from tracerl.algos.losses import (
    AGGREGATIONS,
    POLICY_LOSSES,
    ClipConfig,
    PolicyLossInput,
    aggregate,
    ppo_clip,
)

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "KL",
    "POLICY_LOSSES",
    "ClipConfig",
    "PolicyLossInput",
    "aggregate",
    "kl",
    "kl_reward_penalty",
    "ppo_clip",
]
