"""Synchronous GRPO, one step at a time; reads top to bottom:

    sample G episodes per task through the rollout engine
    -> score each episode as it finishes (a reward function of the episode; the breakdown
       is written with it)
    -> eligibility: environment-, evaluator- or unknown-attributed episodes, and rewards the
       evaluator could not decide, are left out
    -> advantages per group (a registered estimator; eligible members only)
    -> one learner update on every sample of every eligible episode
    -> bump the sampler's policy version (the weights are shared in-process)

What it leaves to others: checkpoints and held-out evaluation are `tracerl train`'s
(`tracerl.train.loop`), and a KL term is the learner's (`LearnerConfig.kl_coef`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from tracerl.algos.advantages import get as get_advantage
from tracerl.rollout.budget import RolloutConfig
from tracerl.rollout.groups import EnvSource, RolloutBackend, rollout_metrics, run_groups
from tracerl.rollout.persist import EpisodeWriter
from tracerl.rollout.runner import Episode, Policy
from tracerl.train.learner import Learner
from tracerl.train.metrics import (
    gradient_eligible,
    owner_metrics,
    scored_metrics,
    signal_metrics,
)
from tracerl.train.turn_credit import turn_level_advantages
from tracerl.types import RewardBreakdown, StopReason

RewardFn = Callable[[Episode], float | RewardBreakdown]
"""A plain number or a `RewardBreakdown` (see `tracerl.rollout.episode.score_episode`)."""


@dataclass
class GRPOConfig:
    group_size: int = 8
    advantage: str = "grpo"
    credit: str = "episode"
    """``episode``, or a turn-level estimator (`tracerl.train.turn_credit`)."""
    credit_gamma: float = 1.0
    step_group_weight: float = 1.0
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    max_concurrent_episodes: int = 32
    timeouts: str = "exclude"
    """Episodes that ran out of wall time: ``exclude`` them from the gradient, or ``grade``
    them on what they did with the reward clamped to at most `timeout_reward_cap`."""
    timeout_reward_cap: float = 0.0


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
    backend: RolloutBackend | None = None,
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
            backend=backend,
        )
    )
    metrics = update_on_groups(groups, learner, cfg)
    policy.sampler.policy_version += 1
    metrics["train/reused_episodes"] = float(
        sum(e.episode_id in (done or {}) for g in groups for e in g)
    )
    metrics["train/policy_version"] = float(policy.sampler.policy_version)
    return metrics, [e for g in groups for e in g]


def training_rewards(
    episodes: Sequence[Episode], cfg: GRPOConfig
) -> tuple[list[float], list[bool]]:
    """Each episode's reward and whether it may train the policy. A timeout is excluded, or
    (``timeouts: grade``) kept with its reward clamped to `timeout_reward_cap`."""
    rewards, eligible = [], []
    for e in episodes:
        assert e.reward is not None, "episodes are scored before training"
        total, ok = e.reward.total, gradient_eligible(e)
        if e.stop_reason is StopReason.TIMEOUT and cfg.timeouts == "grade" and e.reward.decided:
            total, ok = min(total, cfg.timeout_reward_cap), e.reward.error is None
        rewards.append(total)
        eligible.append(ok)
    return rewards, eligible


def update_on_groups(
    groups: Sequence[Sequence[Episode]],
    learner: Learner,
    cfg: GRPOConfig,
    *,
    sample_weights: Sequence[float] | None = None,
    lr_scale: float = 1.0,
) -> dict[str, float]:
    """Rewards, eligibility, advantages per group, one learner update, and the step's
    metrics. `sample_weights` (one per episode, mean 1) and `lr_scale` come from staleness
    in asynchronous training (`tracerl.algos.staleness`)."""
    episodes = [e for g in groups for e in g]
    rewards, eligible = training_rewards(episodes, cfg)
    rewards_B = torch.tensor(rewards, dtype=torch.float32)
    group_B = torch.tensor([gi for gi, g in enumerate(groups) for _ in g])
    eligible_B = torch.tensor(eligible, dtype=torch.bool)
    weights = sample_weights if sample_weights is not None else [1.0] * len(episodes)
    rows: list[Any] = []
    advs: list[Any] = []
    if cfg.credit == "episode":
        advantages_B = get_advantage(cfg.advantage)(rewards_B, group_B, eligible_B)
        for e, a, w, ok in zip(episodes, advantages_B.tolist(), weights, eligible, strict=True):
            if ok:
                rows += e.trajectories
                advs += [a * w] * len(e.trajectories)
    else:  # one advantage per turn, on that turn's tokens
        params: dict[str, Any] = {"gamma": cfg.credit_gamma}
        if cfg.credit == "step_groups":
            params.update(omega=cfg.step_group_weight, base=cfg.advantage)
        per_token = turn_level_advantages(
            episodes, rewards, group_B, eligible, cfg.credit, **params
        )
        for e, tokens, w, ok in zip(episodes, per_token, weights, eligible, strict=True):
            if ok:
                rows += e.trajectories
                advs += [[a * w for a in row] for row in tokens]
    metrics = learner.update(rows, advs, lr_scale=lr_scale) if rows else {}
    metrics.update(rollout_metrics(episodes) | owner_metrics(episodes))
    metrics["train/reward_mean"] = float(rewards_B.mean()) if episodes else 0.0
    metrics.update({f"train/{k}": v for k, v in scored_metrics(episodes).items()})
    metrics["train/ineligible_episodes"] = float(sum(not ok for ok in eligible))
    metrics.update(signal_metrics(rewards, eligible, [len(g) for g in groups]))
    return metrics
