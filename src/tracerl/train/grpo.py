"""Synchronous GRPO, one step at a time; reads top to bottom:

    sample G episodes per task through the rollout engine
    -> score each episode as it finishes (a reward function of the episode; the breakdown
       is written with it)
    -> eligibility: environment-, evaluator- or unknown-attributed episodes, and rewards the
       evaluator could not decide, are left out
    -> advantages per group (a registered estimator; eligible members only)
    -> one learner update on every sample of every eligible episode
    -> bump the sampler's policy version (the weights are shared in-process)

What it simplifies (for now): no checkpoints, no held-out evaluation inside the step, no
KL term; those come with `tracerl train`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from tracerl.algos.advantages import get as get_advantage
from tracerl.rollout.budget import RolloutConfig
from tracerl.rollout.groups import EnvSource, rollout_metrics, run_groups
from tracerl.rollout.persist import EpisodeWriter
from tracerl.rollout.runner import Episode, Policy
from tracerl.train.learner import Learner
from tracerl.train.metrics import gradient_eligible, owner_metrics, scored_metrics
from tracerl.types import RewardBreakdown

RewardFn = Callable[[Episode], float | RewardBreakdown]
"""A plain number or a `RewardBreakdown` (see `tracerl.rollout.episode.score_episode`)."""


@dataclass
class GRPOConfig:
    group_size: int = 8
    advantage: str = "grpo"
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    max_concurrent_episodes: int = 32


def grpo_step(
    env: EnvSource,
    tasks: Sequence[dict[str, Any]],
    policy: Policy,
    learner: Learner,
    reward_fn: RewardFn,
    cfg: GRPOConfig,
    *,
    step: int,
    writer: EpisodeWriter | None = None,
    done: dict[str, Episode] | None = None,
    on_episode: Callable[[Episode], None] | None = None,
) -> tuple[dict[str, float], list[Episode]]:
    """One step. `writer` appends each finished episode to the run directory; `done` holds
    this step's episodes already on disk (after a crash), which are reused, not re-run."""
    groups = asyncio.run(
        run_groups(
            env,
            tasks,
            policy,
            cfg.rollout,
            group_size=cfg.group_size,
            seed=step,
            max_concurrent_episodes=cfg.max_concurrent_episodes,
            writer=writer,
            done=done,
            on_episode=on_episode,
            score=reward_fn,
        )
    )
    episodes = [e for g in groups for e in g]
    rewards_B = torch.tensor([e.reward.total for e in episodes], dtype=torch.float32)
    group_B = torch.tensor([gi for gi, g in enumerate(groups) for _ in g])
    eligible_B = torch.tensor([gradient_eligible(e) for e in episodes])
    advantages_B = get_advantage(cfg.advantage)(rewards_B, group_B, eligible_B)
    rows, advs = [], []
    for e, a, ok in zip(episodes, advantages_B.tolist(), eligible_B.tolist(), strict=True):
        if ok:
            rows += e.trajectories
            advs += [a] * len(e.trajectories)
    metrics = learner.update(rows, advs) if rows else {}
    policy.sampler.policy_version += 1
    metrics.update(rollout_metrics(episodes) | owner_metrics(episodes))
    metrics["train/reward_mean"] = float(rewards_B.mean())
    metrics.update({f"train/{k}": v for k, v in scored_metrics(episodes).items()})
    metrics["train/reused_episodes"] = float(sum(e.episode_id in (done or {}) for e in episodes))
    metrics["train/policy_version"] = float(policy.sampler.policy_version)
    return metrics, episodes
