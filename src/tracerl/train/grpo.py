"""Synchronous GRPO, one step at a time; reads top to bottom:

    sample G episodes per task through the rollout engine
    -> score each episode as it finishes (a reward function of the episode; the breakdown
       is written with it)
    -> eligibility: environment-, evaluator- or unknown-attributed episodes, and rewards the
       evaluator could not decide, are left out
    -> advantages per group (a registered estimator; eligible members only)
    -> one learner update on every sample of every eligible episode (with a distillation
       teacher: an episode it could not grade is the evaluator's, left out and marked so on
       disk, `tracerl.train.distill.attribution`)
    -> bump the sampler's policy version (the weights are shared in-process)

What it leaves to others: checkpoints and held-out evaluation are `tracerl train`'s
(`tracerl.train.loop`), and a KL term is the learner's (`LearnerConfig.kl_coef`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from tracerl.algos.advantages import get as get_advantage
from tracerl.rollout.budget import RolloutConfig
from tracerl.rollout.groups import EnvSource, RolloutBackend, rollout_metrics, run_groups
from tracerl.rollout.persist import EpisodeWriter
from tracerl.rollout.runner import Episode, Policy
from tracerl.train.distill import Distiller
from tracerl.train.distill.attribution import mark_unscored, marked_by_update, rewrite_rewards
from tracerl.train.dynamic_sampling import DynamicSampling, Refill, sample_with_signal
from tracerl.train.interrupt import cancellable
from tracerl.train.learner import Learner
from tracerl.train.metrics import (
    gradient_eligible,
    owner_metrics,
    scored_metrics,
    signal_metrics,
    train_reward_mean,
)
from tracerl.train.subagent_credit import child_advantages, child_reward_metrics
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
    sample_weighting: str = "episode"
    """``episode``: an episode's samples share its weight in the loss; ``sample``: each
    weighs one (`sample_weights`)."""
    credit_gamma: float = 1.0
    step_group_weight: float = 1.0
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    max_concurrent_episodes: int = 32
    timeouts: str = "exclude"
    """Episodes that ran out of wall time: ``exclude`` them from the gradient, or ``grade``
    them on what they did with the reward clamped to at most `timeout_reward_cap`."""
    timeout_reward_cap: float = 0.0
    dynamic_sampling: DynamicSampling | None = None
    """Sample replacement groups for those without signal (None: off)."""
    distill: Distiller | None = None
    """On-policy distillation: the teacher's per-token term joins each row's advantage
    (`tracerl.train.distill`; None: off)."""


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
    refill: Refill | None = None,
    before_update: Callable[[], None] | None = None,
) -> tuple[dict[str, float], list[Episode]]:
    """One step. `writer` appends each finished episode to the run directory; `done` holds
    this step's episodes already on disk (after a crash), which are reused, not re-run.
    With ``cfg.dynamic_sampling``, `refill` draws replacement tasks for groups without
    signal (`tracerl.train.dynamic_sampling`). `before_update` is called once the
    rollouts are in, before the update (the engine's `pause`: a vLLM server in sleep mode
    gives the learner its GPU memory). Returns the metrics and every episode the step
    sampled."""

    async def run_round(round_tasks: list[dict[str, Any]], first: int) -> list[list[Episode]]:
        return await run_groups(
            env,
            round_tasks,
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
            first_index=first,
        )

    # a stop request cancels the rollouts (the finished episodes are on disk, reused by
    # --resume); once they are in, the update runs to its end
    sampled = asyncio.run(
        cancellable(
            sample_with_signal(
                tasks, run_round, lambda g: has_signal(g, cfg), cfg.dynamic_sampling, refill
            )
        )
    )
    marked = marked_by_update(sampled.train)
    if before_update is not None:
        before_update()
    metrics = update_on_groups(
        sampled.train, learner, cfg, sampled=sampled.drawn, signal=sampled.signal
    )
    if writer is not None:  # the teacher's verdicts, into the records already on disk
        rewrite_rewards(writer.path, marked())
    metrics.update(sampled.metrics(cfg.dynamic_sampling is not None))
    policy.sampler.policy_version += 1
    drawn = [e for g in sampled.drawn for e in g]
    metrics["train/reused_episodes"] = float(sum(e.episode_id in (done or {}) for e in drawn))
    metrics["train/policy_version"] = float(policy.sampler.policy_version)
    return metrics, drawn


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


def episode_advantages(
    groups: Sequence[Sequence[Episode]], cfg: GRPOConfig
) -> tuple[list[float], list[bool], list[Any]]:
    """Each episode's reward, whether it may train the policy, and its advantage: a number
    (``credit: episode``), or per trajectory one per token (turn-level credit)."""
    episodes = [e for g in groups for e in g]
    if not episodes:
        return [], [], []
    rewards, eligible = training_rewards(episodes, cfg)
    group_B = torch.tensor([gi for gi, g in enumerate(groups) for _ in g], dtype=torch.long)
    if cfg.credit == "episode":
        rewards_B = torch.tensor(rewards, dtype=torch.float32)
        eligible_B = torch.tensor(eligible, dtype=torch.bool)
        return (
            rewards,
            eligible,
            get_advantage(cfg.advantage)(rewards_B, group_B, eligible_B).tolist(),
        )
    params: dict[str, Any] = {"gamma": cfg.credit_gamma}
    if cfg.credit == "step_groups":
        params.update(omega=cfg.step_group_weight, base=cfg.advantage)
    per_token = turn_level_advantages(episodes, rewards, group_B, eligible, cfg.credit, **params)
    return rewards, eligible, per_token


def has_signal(group: Sequence[Episode], cfg: GRPOConfig) -> bool:
    """Whether the group can teach anything: some eligible member gets a non-zero advantage
    (under the run's estimator and credit, the group on its own). A group whose eligible
    rewards are all equal, or with fewer than two eligible members, has none."""
    _, eligible, advantages = episode_advantages([group], cfg)
    if cfg.distill is not None and any(eligible):  # the teacher grades every policy token
        return True
    if any(ok and _nonzero(a) for ok, a in zip(eligible, advantages, strict=True)):
        return True
    own = child_advantages([group], eligible, cfg.advantage)  # graded sub-agents
    return any(a is not None and _nonzero(a) for a in own.values())


def _nonzero(a: Any) -> bool:
    if isinstance(a, float | int):
        return abs(a) > 1e-6  # above float32 rounding of an exact 0
    return any(_nonzero(x) for x in a)


def row_shares(episode: Episode, weighting: str) -> list[float]:
    """Each of the episode's samples' weight in the loss: 1/n for its n samples that hold
    policy tokens (``episode``; a sample without any trains nothing either way), or 1
    (``sample``)."""
    if weighting == "sample":
        return [1.0] * len(episode.trajectories)
    n = sum(1 for t in episode.trajectories if any(t.loss_mask)) or 1
    return [1.0 / n] * len(episode.trajectories)


def update_on_groups(
    groups: Sequence[Sequence[Episode]],
    learner: Learner,
    cfg: GRPOConfig,
    *,
    sample_weights: Sequence[float] | None = None,
    lr_scale: float = 1.0,
    sampled: Sequence[Sequence[Episode]] | None = None,
    signal: Sequence[bool] | None = None,
) -> dict[str, float]:
    """Rewards, eligibility, advantages per group, one learner update, and the step's
    metrics. `sample_weights` (one per episode, mean 1) and `lr_scale` come from staleness
    in asynchronous training (`tracerl.algos.staleness`). `sampled`: every group the step
    sampled, when some were left out of the update (dynamic sampling): the rollout and
    reward metrics describe them all, so filtering cannot flatter the training curve.
    `signal`: whether each of those groups has signal, when the caller knows already."""
    episodes = [e for g in groups for e in g]
    rewards, eligible, advantages = episode_advantages(groups, cfg)
    own = child_advantages(groups, eligible, cfg.advantage)  # graded sub-agents
    weights = sample_weights if sample_weights is not None else [1.0] * len(episodes)
    rows: list[Any] = []
    outcome: list[Any] = []  # one advantage per sample, or per turn on that turn's tokens
    row_weights: list[float] = []
    shares: list[float] = []
    row_episode: list[int] = []  # each row's episode (its index in `episodes`)
    for i, (e, a, w, ok) in enumerate(zip(episodes, advantages, weights, eligible, strict=True)):
        if not ok:
            continue
        per_row = [a] * len(e.trajectories) if isinstance(a, float | int) else a
        shares_e = row_shares(e, cfg.sample_weighting)
        for t, share, x in zip(e.trajectories, shares_e, per_row, strict=True):
            if t.agent and (i, t.agent) in own:  # a sub-agent with its own reward
                x = own[(i, t.agent)]
                if x is None:  # its grading failed: the evaluator's, trains on nothing
                    continue
            rows.append(t)
            shares.append(share)
            outcome.append(x)
            row_weights.append(w)
            row_episode.append(i)
    extra: dict[str, float] = {}
    out: set[int] = set()  # episodes the teacher made the evaluator's
    if cfg.distill is not None and rows:  # the teacher's term, per token
        d = cfg.distill.apply(rows, outcome, row_weights)
        # an episode with a sample the teacher could not score is the evaluator's, whole
        out = mark_unscored(episodes, row_episode, rows, d.unscored, cfg.distill.teacher.label)
        keep = [
            (k, a) for k, a in zip(d.keep, d.advantages, strict=True) if row_episode[k] not in out
        ]
        rows, shares = [rows[k] for k, _ in keep], [shares[k] for k, _ in keep]
        advs = [a for _, a in keep]
        extra = d.metrics
    else:
        advs = [
            x * w if isinstance(x, float | int) else [v * w for v in x]
            for x, w in zip(outcome, row_weights, strict=True)
        ]
    t0 = time.perf_counter()
    metrics = learner.update(rows, advs, lr_scale=lr_scale, weights=shares) if rows else {}
    metrics.update(extra)
    # what the learner paid: its time, and every token of every sample it ran
    metrics["time/update_s"] = time.perf_counter() - t0
    metrics["train/sample_tokens"] = float(sum(len(t) for t in rows))
    seen = list(sampled) if sampled is not None else list(groups)
    observed = [e for g in seen for e in g]
    metrics.update(rollout_metrics(observed) | owner_metrics(observed))
    # read again where the teacher made some episodes the evaluator's since
    fresh = sampled is None and not out
    totals, ok_seen = (rewards, eligible) if fresh else training_rewards(observed, cfg)
    metrics.update(train_reward_mean(observed, totals))  # over decided episodes only
    metrics.update({f"train/{k}": v for k, v in scored_metrics(observed).items()})
    metrics.update(child_reward_metrics(seen))
    metrics["train/ineligible_episodes"] = float(sum(not ok for ok in ok_seen))
    if signal is None:
        signal = [has_signal(g, cfg) for g in seen]
    metrics.update(signal_metrics(signal))
    return metrics
