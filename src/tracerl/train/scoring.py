"""The run's reward function, chosen by ``trainer.reward``."""

from __future__ import annotations

from typing import Any

from tracerl.config import RunConfig
from tracerl.rollout.episode import ScoreFn
from tracerl.rollout.runner import Episode
from tracerl.types import RewardBreakdown


def reward_function(cfg: RunConfig, probe: Any) -> ScoreFn:
    """The run's reward: a plain number (arithmetic) or a layered breakdown (search)."""
    if cfg.trainer.reward == "arithmetic":
        from tracerl.envs.arithmetic import digit_reward

        def arithmetic(e: Episode) -> float:
            segs = e.trajectories[0].policy_segments()
            text = (segs[0].text or "") if segs else ""
            return digit_reward(text, e.receipt.task["answers"][0])

        return arithmetic
    if cfg.trainer.reward == "coderepair":
        from tracerl.envs.coderepair.reward import code_repair_reward

        return code_repair_reward()
    from tracerl.rewards import SEARCH_REWARD, RewardContext, RewardSpec, compose

    spec = RewardSpec.from_yaml(SEARCH_REWARD)
    lookup = getattr(probe, "document", lambda _: None)

    def search(e: Episode) -> RewardBreakdown:
        return compose(spec, RewardContext.from_trajectories(e.trajectories, lookup))

    return search
