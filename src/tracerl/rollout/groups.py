"""Groups of episodes: G episodes of one task (what GRPO compares), many groups at once.

`run_groups` bounds concurrency across all groups with one semaphore, so a batch of tasks
never has more than `max_concurrent_episodes` environments open, while a batching sampler
still sees every waiting episode at once. Each finished episode is appended to the run
directory as soon as it finishes (see `EpisodeWriter`), so a crash loses only episodes in
flight. `rollout_metrics` summarizes a batch in the metric names the dashboard plots.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import math
import re
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from tracerl.envs.base import Env
from tracerl.envs.registry import make
from tracerl.rollout.budget import RolloutConfig
from tracerl.rollout.context.metrics import context_metrics
from tracerl.rollout.episode import ScoreFn, score_episode
from tracerl.rollout.persist import EpisodeWriter
from tracerl.rollout.runner import Episode, Policy, episode_seed, run_episode
from tracerl.types import Attribution, StopReason

log = logging.getLogger("tracerl")
EnvSource = str | Callable[[], Env]


class RolloutBackend(Protocol):
    """Where episodes run. None (the default everywhere) runs them in this process, on the
    policy's sampler; `tracerl.rollout.ray_workers.RayRollouts` runs them in Ray actors."""

    async def run_episode(
        self,
        env: Callable[[], Env],
        task: dict[str, Any],
        policy: Policy,
        config: RolloutConfig | None,
        *,
        seed: int,
        episode_id: str,
    ) -> Episode: ...


def in_flight_limit(default: int, backend: RolloutBackend | None) -> int:
    """Episodes to keep in flight: `default` in process, the backend's capacity if it says."""
    return getattr(backend, "capacity", default) if backend is not None else default


def _factory(env: EnvSource) -> Callable[[], Env]:
    return (lambda: make(env)) if isinstance(env, str) else env


async def run_group(
    env: EnvSource,
    task: dict[str, Any],
    policy: Policy,
    config: RolloutConfig | None = None,
    *,
    group_size: int,
    seed: int = 0,
    writer: EpisodeWriter | None = None,
    limit: asyncio.Semaphore | None = None,
    done: dict[str, Episode] | None = None,
    index: int | None = None,
    on_episode: Callable[[Episode], None] | None = None,
    score: ScoreFn | None = None,
    backend: RolloutBackend | None = None,
    stage: str | None = None,
) -> list[Episode]:
    """`group_size` episodes of one task, each with its own seed and a fresh env (run where
    `backend` says: in this process by default).

    `done` maps episode ids to episodes already finished (read back from the run directory
    after a crash): those are returned as they are, not run (or written) again.
    `on_episode` is called with each episode as it finishes (or is reused): progress bars.
    `score` (the run's reward) is attached to each episode before it is written, so the
    run directory keeps every reward breakdown; a reused episode keeps the one it has. A
    reward that ranks a group's members against one another (``score.needs_group``: a
    group-relative judge) scores the group once all have finished (``score.score_group``),
    and the group is written then; one that waits on a model (``score.blocking``) is
    scored on a thread pool of its own, so the other episodes run meanwhile.
    """
    if group_size < 1:
        raise ValueError(f"run_group: group_size must be >= 1, got {group_size}")
    factory = _factory(env)
    # a reward that ranks the group's members against one another scores them together,
    # once all have finished; one that waits on a model (a judge) is scored off this loop
    together = score is not None and bool(getattr(score, "needs_group", False))
    blocking = bool(getattr(score, "blocking", False))

    async def member(g: int) -> Episode:
        eid = group_episode_id(task, seed, g, index, stage)
        if done is not None and eid in done:
            episode = done[eid]
            if score is not None and episode.reward is None and not together:
                score_episode(episode, score)  # written before it was scored
            if on_episode is not None:
                on_episode(episode)
            return episode
        member_seed = episode_seed(seed, task.get("id"), g, *(() if index is None else (index,)))
        async with limit or contextlib.nullcontext():
            if backend is None:
                episode = await run_episode(
                    factory(), task, policy, config, seed=member_seed, episode_id=eid
                )
            else:
                episode = await backend.run_episode(
                    factory, task, policy, config, seed=member_seed, episode_id=eid
                )
        if score is not None and not together:
            if blocking:
                await _off_loop(score_episode, episode, score)
            else:
                score_episode(episode, score)
        if writer is not None and not together:
            writer.append(episode.trajectories)
        if on_episode is not None:
            on_episode(episode)
        return episode

    episodes = list(await asyncio.gather(*(member(g) for g in range(group_size))))
    if together:
        assert score is not None
        fresh = [e for e in episodes if e.reward is None]  # not read back already scored
        if fresh:
            await _off_loop(_score_together, episodes, fresh, score)
        if writer is not None:
            reused = set() if done is None else set(done)
            for e in episodes:
                if e.episode_id not in reused:
                    writer.append(e.trajectories)
    return episodes


SCORING_THREADS = 32
"""Rewards that wait on a model (a judge) are scored on a pool of their own, this wide: as
many judge requests in flight as episodes finishing, not the default pool's few threads
(min(32, CPUs + 4))."""
_scoring: concurrent.futures.ThreadPoolExecutor | None = None


async def _off_loop(fn: Callable[..., Any], *args: Any) -> Any:
    global _scoring
    if _scoring is None:
        _scoring = concurrent.futures.ThreadPoolExecutor(
            SCORING_THREADS, thread_name_prefix="tracerl-score"
        )
    return await asyncio.get_running_loop().run_in_executor(_scoring, functools.partial(fn, *args))


def _score_together(episodes: list[Episode], fresh: list[Episode], score: Any) -> None:
    """Score `fresh` members of a group whose reward needs all of `episodes` at once (a
    crash there is the evaluator's, on every fresh member: never a silent 0)."""
    try:
        breakdowns = dict(zip([id(e) for e in episodes], score.score_group(episodes), strict=True))
    except Exception as e:
        error = e

        def crashed(_: Episode) -> Any:
            raise error

        for episode in fresh:
            score_episode(episode, crashed)
        return
    for episode in fresh:
        score_episode(episode, lambda e: breakdowns[id(e)])


def group_episode_id(
    task: dict[str, Any], seed: int, g: int, index: int | None = None, stage: str | None = None
) -> str:
    """``<task id>:s<seed>[:<stage>][:t<position>]:g<member>``: the position keeps two copies
    of one task in a batch apart; the stage keeps apart the run's phases that draw the same
    tasks with the same seed (a training step's episodes have none: their seed is the step;
    ``warm`` for the warm start's reference, ``eval-<stage>`` for an evaluation). Every
    episode of a run has its own id, so ``${episode_id}`` keys a shared server's state per
    episode (docs/mcp.md). Only letters, digits, ``-``, ``_`` and ``:``: what a server that
    names its state after it most likely accepts."""
    where = "" if index is None else f":t{index}"
    if stage is not None and not _STAGE.fullmatch(stage):
        raise ValueError(
            f"episode id stage {stage!r}: letters, digits, '-' and '_', not starting with "
            "s, t or g (those start the seed, position and member fields)"
        )
    tag = "" if stage is None else f":{stage}"
    return f"{task.get('id')}:s{seed}{tag}{where}:g{g}"


_STAGE = re.compile(r"[a-fh-ru-zA-Z][A-Za-z0-9_-]*")


def episode_task_id(episode_id: str) -> str:
    """The task id inside a `group_episode_id` (task ids may themselves contain ':')."""
    return episode_id.rsplit(":s", 1)[0]


def episode_seed_of(episode_id: str) -> int:
    """The seed inside a `group_episode_id` (a training step's episodes: the step)."""
    return int(episode_id.rsplit(":s", 1)[1].split(":", 1)[0])


def episode_member(episode_id: str) -> int:
    """The member index inside a `group_episode_id`."""
    return int(episode_id.rsplit(":g", 1)[1])


async def run_groups(
    env: EnvSource,
    tasks: Sequence[dict[str, Any]],
    policy: Policy,
    config: RolloutConfig | None = None,
    *,
    group_size: int,
    seed: int = 0,
    max_concurrent_episodes: int = 16,
    writer: EpisodeWriter | None = None,
    done: dict[str, Episode] | None = None,
    on_episode: Callable[[Episode], None] | None = None,
    score: ScoreFn | None = None,
    backend: RolloutBackend | None = None,
    first_index: int = 0,
    stage: str | None = None,
) -> list[list[Episode]]:
    """One group per task, all running concurrently within the episode limit (a backend's
    own capacity when it has one: Ray workers x episodes per worker). Task i has position
    ``first_index + i`` in the step (part of its episode ids: replacement groups of dynamic
    sampling come after the step's own); `stage` tags the ids of a phase other than a training
    step (`group_episode_id`)."""
    limit = asyncio.Semaphore(in_flight_limit(max_concurrent_episodes, backend))
    groups = [
        run_group(
            env,
            t,
            policy,
            config,
            group_size=group_size,
            seed=seed,
            writer=writer,
            limit=limit,
            done=done,
            index=first_index + i,
            on_episode=on_episode,
            score=score,
            backend=backend,
            stage=stage,
        )
        for i, t in enumerate(tasks)
    ]
    return list(await asyncio.gather(*groups))


def p95(values: Sequence[float]) -> float:
    """The 95th percentile (nearest rank); 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


def rollout_metrics(
    episodes: Sequence[Episode], *, unknown_warning: float = 0.05
) -> dict[str, float]:
    """Per-batch rollout metrics: ``stop/<reason>`` (share of episodes), attribution rates
    (share of steps), budget use and the reserve's effect.

    * ``rollout/premature_stop_rate``: episodes a budget cut off without ever being offered
      a finalize turn (what the terminal reserve exists to prevent);
    * ``rollout/unfinished_after_budget``: episodes that ended on any budget without answering;
    * ``cost/tool_latency_ms_mean``: time spent in the environment's tools per episode;
    * ``rollout/latency_p95_s``: the 95th percentile of episode wall time;
    * for gateway episodes (an agent harness drove them): ``agent/history_break_rate`` (the
      share whose harness rewrote its history: more than one sample),
      ``agent/compaction_rate`` (the share with a break recognized as the harness compacting
      its history), ``agent/requests_mean`` and ``agent/exception_rate`` (the share whose
      agent raised).
    """
    n = max(1, len(episodes))
    m: dict[str, float] = {}
    for reason in StopReason:
        m[f"stop/{reason.value}"] = sum(e.stop_reason is reason for e in episodes) / n
    steps = [s for e in episodes for s in e.steps if "action" in s]
    k = max(1, len(steps))
    m["attribution/policy_error_rate"] = sum(bool(s.get("policy_error")) for s in steps) / k
    m["attribution/env_error_rate"] = sum(bool(s.get("infra_error")) for s in steps) / k
    m["attribution/unknown_rate"] = sum(bool(s.get("unknown_error")) for s in steps) / k
    for owner in Attribution:
        m[f"attribution/episodes_{owner.value}"] = sum(e.attribution is owner for e in episodes) / n
    budget_stops = [e for e in episodes if e.stop_reason.is_budget]
    m["rollout/premature_stop_rate"] = (
        sum(not e.receipt.ledger.get("finalize") for e in budget_stops) / n
    )
    m["rollout/unfinished_after_budget"] = len(budget_stops) / n
    m["rollout/finalize_rate"] = sum(bool(e.receipt.ledger.get("finalize")) for e in episodes) / n
    m["rollout/gradient_eligible_rate"] = sum(e.gradient_eligible for e in episodes) / n
    # three kinds of trouble, never summed: out of wall time, the environment, the policy
    # (``train/policy_failure_rate``, which needs the reward)
    m["rollout/timeout_rate"] = sum(e.stop_reason is StopReason.TIMEOUT for e in episodes) / n
    m["rollout/infra_failure_rate"] = (
        sum(
            e.attribution is Attribution.ENVIRONMENT and e.stop_reason is not StopReason.TIMEOUT
            for e in episodes
        )
        / n
    )
    m["rollout/retries"] = sum(max(0, len(s.get("attempts", [])) - 1) for s in steps)
    # rollout workers (`trainer.rollout.backend: ray`) that died with the episode in flight:
    # it was run again elsewhere, or (none left) ended as an infrastructure failure
    m["rollout/worker_reruns"] = (
        sum(bool((e.receipt.worker or {}).get("failed_attempts")) for e in episodes) / n
    )
    for key in ("steps", "tool_calls", "sampled_tokens", "write_actions"):
        m[f"cost/{key}_mean"] = sum(e.receipt.ledger["used"][key] for e in episodes) / n
    m["cost/tool_latency_ms_mean"] = (
        sum(s.get("latency_ms") or 0.0 for e in episodes for s in e.receipt.steps) / n
    )
    m["rollout/latency_p95_s"] = p95([e.receipt.wall_time_s or 0.0 for e in episodes])
    m.update(context_metrics(episodes))  # samples, compactions, sub-agents
    agents = [e.receipt.agent for e in episodes if e.receipt.agent is not None]
    if agents:  # episodes an agent harness drove through the gateway (`tracerl.gateway`)
        m["agent/history_break_rate"] = sum(bool(a.get("history_breaks")) for a in agents) / n
        m["agent/compaction_rate"] = (
            sum(
                any(b.get("kind") == "compaction" for b in a.get("history_breaks") or ())
                for a in agents
            )
            / n
        )
        m["agent/requests_mean"] = sum(a.get("requests", 0) for a in agents) / n
        m["agent/exception_rate"] = sum(a.get("exception") is not None for a in agents) / n
    if m["attribution/unknown_rate"] > unknown_warning:
        log.warning(
            "%.0f%% of steps failed with an unattributed fault (threshold %.0f%%): fix "
            "observation and logging before scaling training",
            100 * m["attribution/unknown_rate"],
            100 * unknown_warning,
        )
    return m
