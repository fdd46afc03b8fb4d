"""Asynchronous GRPO: rollout workers keep sampling while the learner trains.

    producer: batch b's tasks (the same draw as synchronous step b) -> one group per task,
        all concurrently; each finished group (scored, written to episodes/step_<b>) goes
        into a bounded buffer. Batch b starts only once the learner has finished step
        b - 1 - max_staleness, so no group can start that would be too old.
    consumer (the learner): for each step, take groups from the buffer in the order they
        finish (a slow group never holds up the others), drop any whose oldest token is
        more than `max_staleness` versions behind (counted, never trained on), weight the
        rest by their staleness (`tracerl.algos.staleness`), and update in a worker thread
        while the producer keeps sampling.

Weight sync. The sampler shares the learner's weights in-process. Each batched generation
holds the weights lock for the whole turn, and the optimizer's step takes the same lock: a
turn that is being generated finishes on the weights it started with, and the policy
version is bumped under that lock right after the step, so every turn's tokens carry the
version that really sampled them. An episode that spans an update carries several versions
(its turns before and after); its staleness is that of its oldest token. Other episodes'
tool calls never wait for the learner. The receipt records ``weight_sync: between_turns``.

Evaluations run inside the same event loop, between updates: the weights do not change
while they run, and the producer keeps sampling meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tracerl.algos.staleness import staleness_scales
from tracerl.rollout.groups import run_group
from tracerl.rollout.persist import EpisodeWriter
from tracerl.rollout.runner import Episode, Policy
from tracerl.train.grpo import GRPOConfig, RewardFn, update_on_groups
from tracerl.train.learner import Learner

WEIGHT_SYNC = "between_turns"


def episode_versions(e: Episode) -> list[int]:
    """The policy versions that sampled the episode's tokens, one per model turn."""
    return [
        s.policy_version
        for t in e.trajectories
        for s in t.policy_segments()
        if s.policy_version is not None
    ]


def staleness_of(group: Sequence[Episode], version: int) -> int:
    """How many versions the group's oldest token lags `version` (0 if it sampled none)."""
    versions = [v for e in group for v in episode_versions(e)]
    return version - min(versions) if versions else 0


@dataclass
class AsyncSettings:
    steps: int
    start: int = 0
    max_staleness: int = 1
    staleness_lr: Any = None
    """A `tracerl.config.StalenessLR` (None: off)."""
    seed: int = 0
    max_buffered_groups: int | None = None
    """Finished groups waiting for the learner (default: two steps' worth)."""


@dataclass
class _State:
    version_steps: int  # learner steps finished (absolute step index of the next update)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    dropped_stale: int = 0  # episodes
    in_flight: int = 0  # groups started and not yet in the buffer


async def train_async(
    env: Any,
    batch_tasks: Callable[[int], list[dict[str, Any]]],
    policy: Policy,
    learner: Learner,
    reward_fn: RewardFn,
    grpo: GRPOConfig,
    settings: AsyncSettings,
    *,
    writer: Callable[[int], EpisodeWriter | None],
    done: Callable[[int], dict[str, Episode]],
    after_step: Callable[[int, dict[str, float], list[Episode]], Awaitable[bool]],
    on_episode: Callable[[Episode], None] | None = None,
) -> None:
    """Run steps ``settings.start .. settings.steps - 1``. `batch_tasks(b)` gives batch b's
    tasks; `writer(b)` / `done(b)` its episode file and the episodes already in it;
    `after_step(step, metrics, episodes)` logs, checkpoints and evaluates; False stops."""
    sampler = policy.sampler
    grpo = dataclasses.replace(
        grpo, rollout=grpo.rollout.model_copy(update={"weight_sync": WEIGHT_SYNC})
    )
    groups_per_step = len(batch_tasks(settings.start)) if settings.start < settings.steps else 0
    buffer: asyncio.Queue[list[Episode]] = asyncio.Queue(
        settings.max_buffered_groups or 2 * max(1, groups_per_step)
    )
    state = _State(settings.start)

    def bump() -> None:  # under the weights lock, right after the optimizer's step
        sampler.policy_version += 1

    learner.weights_lock = getattr(sampler, "_model_lock", None) or contextlib.nullcontext()
    learner.after_update = bump
    producer = asyncio.create_task(
        _produce(
            env,
            batch_tasks,
            policy,
            reward_fn,
            grpo,
            settings,
            state,
            buffer,
            writer,
            done,
            on_episode,
        )
    )
    try:
        for step in range(settings.start, settings.steps):
            m, episodes = await _consume_step(
                step, buffer, learner, grpo, settings, state, groups_per_step, sampler, producer
            )
            async with state.changed:
                state.version_steps = step + 1
                state.changed.notify_all()
            if not await after_step(step, m, episodes):
                break
    finally:
        producer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await producer
        learner.weights_lock, learner.after_update = contextlib.nullcontext(), None


async def _produce(
    env: Any,
    batch_tasks: Callable[[int], list[dict[str, Any]]],
    policy: Policy,
    reward_fn: RewardFn,
    grpo: GRPOConfig,
    settings: AsyncSettings,
    state: _State,
    buffer: asyncio.Queue[list[Episode]],
    writer: Callable[[int], EpisodeWriter | None],
    done: Callable[[int], dict[str, Episode]],
    on_episode: Callable[[Episode], None] | None,
) -> None:
    """Batches in order, each started as soon as the staleness window allows; it runs until
    the consumer cancels it."""
    limit = asyncio.Semaphore(grpo.max_concurrent_episodes)
    running: set[asyncio.Task[None]] = set()

    async def group(b: int, i: int, task: dict[str, Any], w: Any, reuse: dict) -> None:
        episodes = await run_group(
            env,
            task,
            policy,
            grpo.rollout,
            group_size=grpo.group_size,
            seed=b,  # as synchronous step b: the same seeds and episode ids
            writer=w,
            limit=limit,
            done=reuse,
            index=i,
            on_episode=on_episode,
            score=reward_fn,
        )
        await buffer.put(episodes)
        async with state.changed:
            state.in_flight -= 1
            state.changed.notify_all()

    def may_start(b: int) -> bool:
        # the window stays full to the end (its last batches may go untrained): capping
        # production at the groups the learner needs would make one slow group stall it
        if b - state.version_steps <= settings.max_staleness:
            return True  # within the staleness window
        # a starved learner (groups dropped as stale, nothing left in flight or waiting)
        # lets the next batch start now: it samples at the current version, so it is fresh
        return state.in_flight == 0 and buffer.empty()

    try:
        # batches in order, each as soon as the staleness window (or a starved learner) allows
        for b in itertools.count(settings.start):
            size = len(batch_tasks(b))
            async with state.changed:
                await state.changed.wait_for(lambda b=b: may_start(b))
                state.in_flight += size
            w, reuse = writer(b), done(b)
            for i, task in enumerate(batch_tasks(b)):
                t = asyncio.create_task(group(b, i, task, w, reuse))
                running.add(t)
                t.add_done_callback(running.discard)
    finally:
        for t in list(running):
            t.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*running, return_exceptions=True)


async def _consume_step(
    step: int,
    buffer: asyncio.Queue[list[Episode]],
    learner: Learner,
    grpo: GRPOConfig,
    settings: AsyncSettings,
    state: _State,
    groups_per_step: int,
    sampler: Any,
    producer: asyncio.Task[None],
) -> tuple[dict[str, float], list[Episode]]:
    """Fill one step with fresh-enough groups, then update in a worker thread."""
    t0 = time.perf_counter()
    taken: list[list[Episode]] = []
    staleness: list[int] = []
    dropped = 0
    while len(taken) < groups_per_step:
        get = asyncio.ensure_future(buffer.get())
        finished, _ = await asyncio.wait({get, producer}, return_when=asyncio.FIRST_COMPLETED)
        if get not in finished:  # the producer died: surface its error
            get.cancel()
            producer.result()
            raise RuntimeError("the rollout producer stopped before the step was filled")
        group = get.result()
        s = staleness_of(group, sampler.policy_version)
        if s > settings.max_staleness:
            dropped += len(group)
            async with state.changed:  # a starved learner may let the next batch start
                state.changed.notify_all()
            continue
        taken.append(group)
        # the group is kept or dropped whole (GRPO compares its members); each episode's
        # own staleness (its oldest token's) weights it
        staleness += [staleness_of([e], sampler.policy_version) for e in group]
    waited = time.perf_counter() - t0
    cfg = settings.staleness_lr
    scale, weights = staleness_scales(
        staleness,
        getattr(cfg, "kind", "off"),
        getattr(cfg, "alpha", 0.5),
        getattr(cfg, "gamma", 0.7),
    )
    version_before = sampler.policy_version
    t1 = time.perf_counter()
    m = await asyncio.to_thread(
        update_on_groups, taken, learner, grpo, sample_weights=weights, lr_scale=scale
    )
    if sampler.policy_version == version_before:  # no optimizer step ran (no eligible rows)
        sampler.policy_version += 1
    state.dropped_stale += dropped
    m.update(
        {
            "async/staleness_mean": sum(staleness) / max(1, len(staleness)),
            "async/staleness_max": float(max(staleness, default=0)),
            "async/dropped_stale": float(dropped),
            "async/dropped_stale_total": float(state.dropped_stale),
            "async/lr_scale": scale,
            "async/lr_effective": learner.cfg.lr * scale,
            "async/buffered_groups": float(buffer.qsize()),
            "async/learner_wait_s": waited,
            "time/update_s": time.perf_counter() - t1,
            "train/policy_version": float(sampler.policy_version),
        }
    )
    return m, [e for g in taken for e in g]
