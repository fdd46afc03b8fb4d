"""Asynchronous GRPO: rollout workers keep sampling while the learner trains.

    producer: groups in the order of batch b's tasks (the same draw, seeds and episode ids
        as synchronous step b), each started as soon as fewer than
        ``(max_staleness + 1) * groups_per_step`` groups are outstanding (running, or
        finished and waiting for the learner). A finished group (scored, written to
        episodes/step_<b>) goes to the learner.
    consumer (the learner): for each step, take finished groups stalest first (the closest
        to the bound, so the fewest expire; a slow group never holds up the others), drop any
        whose oldest token is more than `max_staleness` versions behind (counted, never
        trained on; its place in the window is freed at once), weight the rest by their
        staleness (`tracerl.algos.staleness`), and update in a worker thread while the
        producer keeps sampling. With dynamic sampling, a group without signal is set
        aside too (counted, its place freed at once), up to ``(max_rounds - 1) x`` the
        step's groups; after that the step trains on the informative groups it has. The
        trained groups' places are freed after the update, so the groups that take them
        sample on the new weights.

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
import json
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracerl.algos.staleness import staleness_scales
from tracerl.report.run import LEDGER_FILE, read_ledger
from tracerl.rollout.groups import (
    RolloutBackend,
    episode_seed_of,
    group_episode_id,
    in_flight_limit,
    run_group,
)
from tracerl.rollout.persist import EpisodeWriter
from tracerl.rollout.runner import Episode, Policy
from tracerl.train.distill.attribution import marked_by_update, rewrite_rewards
from tracerl.train.grpo import GRPOConfig, RewardFn, has_signal, update_on_groups
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


def ledger_writer(run_dir: str | os.PathLike[str]) -> Callable[..., None]:
    """Appends a row to the run's ``async_ledger.jsonl`` per update: the ids of the episodes
    it trained on, of those it dropped as too stale, and of those dynamic sampling set
    aside (no signal)."""
    path = Path(run_dir) / LEDGER_FILE

    def write(
        step: int, trained: list[Episode], dropped: list[Episode], filtered: Sequence = ()
    ) -> None:
        row = {
            "step": step,
            "trained": [e.episode_id for e in trained],
            "dropped_stale": [e.episode_id for e in dropped],
            "filtered": [e.episode_id for e in filtered],
        }
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")

    return write


def consumed_before(run_dir: str | os.PathLike[str], start: int) -> frozenset[str]:
    """The episodes that steps before `start` (those in the checkpoint) trained on or
    dropped. Rows of later steps are ignored: their updates were lost with the crash, so
    their episodes are theirs to train on again."""
    return frozenset(
        eid
        for step, row in read_ledger(run_dir).items()
        if step < start
        for eid in [
            *row.get("trained", []),
            *row.get("dropped_stale", []),
            *row.get("filtered", []),
        ]
    )


@dataclass
class AsyncSettings:
    steps: int
    start: int = 0
    max_staleness: int = 1
    staleness_lr: Any = None
    """A `tracerl.config.StalenessLR` (None: off)."""
    seed: int = 0
    max_outstanding_groups: int | None = None
    """Groups started and not yet trained on or dropped (running, or finished and waiting
    for the learner). Default ``(max_staleness + 1) * groups_per_step``."""
    consumed: frozenset[str] = frozenset()
    """After a resume: episode ids that checkpointed steps trained on or dropped (the run's
    ledger). Their groups are not run or trained on again."""


@dataclass
class _State:
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    finished: list[list[Episode]] = field(default_factory=list)  # groups for the learner
    started: int = 0  # groups
    consumed: int = 0  # groups dropped, or trained on and the update done
    dropped_stale: int = 0  # episodes
    error: BaseException | None = None  # a group that raised: the run stops with it

    async def fail(self, exc: BaseException) -> None:
        """Hand an error to the learner, which re-raises it."""
        async with self.changed:
            self.error = exc
            self.changed.notify_all()


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
    ledger: Callable[..., None] | None = None,
    backend: RolloutBackend | None = None,
) -> None:
    """Run steps ``settings.start .. settings.steps - 1``. `batch_tasks(b)` gives batch b's
    tasks; `writer(b)` / `done(b)` its episode file and the episodes already in it;
    `after_step(step, metrics, episodes)` logs, checkpoints and evaluates; False stops.
    `ledger(step, trained, dropped, filtered)` records which episodes each update used and
    left out, before `after_step` (a resume skips those of checkpointed steps:
    `AsyncSettings.consumed`)."""
    sampler = policy.sampler
    grpo = dataclasses.replace(
        grpo, rollout=grpo.rollout.model_copy(update={"weight_sync": WEIGHT_SYNC})
    )
    groups_per_step = len(batch_tasks(settings.start)) if settings.start < settings.steps else 0
    cap = settings.max_outstanding_groups or (settings.max_staleness + 1) * groups_per_step
    if cap < groups_per_step:  # a step's groups stay outstanding until its update is done
        raise ValueError(
            f"trainer.max_outstanding_groups={cap} is less than the {groups_per_step} groups "
            "one step trains on (env.tasks_per_step): the learner could never fill a step; "
            f"set it to at least {groups_per_step}, or leave it unset"
        )
    state = _State()

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
            max(1, cap),
            writer,
            done,
            on_episode,
            backend,
        )
    )
    try:
        for step in range(settings.start, settings.steps):
            m, episodes, dropped, filtered = await _consume_step(
                learner, grpo, settings, state, groups_per_step, sampler, writer
            )
            if ledger is not None:
                ledger(step, episodes, dropped, filtered)
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
    cap: int,
    writer: Callable[[int], EpisodeWriter | None],
    done: Callable[[int], dict[str, Episode]],
    on_episode: Callable[[Episode], None] | None,
    backend: RolloutBackend | None,
) -> None:
    """Groups in batch order, each started as soon as fewer than `cap` are outstanding;
    it runs until the consumer cancels it."""
    limit = asyncio.Semaphore(in_flight_limit(grpo.max_concurrent_episodes, backend))
    running: set[asyncio.Task[None]] = set()

    async def group(b: int, i: int, task: dict[str, Any], w: Any, reuse: dict) -> None:
        try:
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
                backend=backend,
            )
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            await state.fail(exc)
            return
        async with state.changed:
            state.finished.append(episodes)
            state.changed.notify_all()

    try:
        for b in itertools.count(settings.start):
            w, reuse = writer(b), done(b)
            for i, task in enumerate(batch_tasks(b)):
                if group_episode_id(task, b, 0, i) in settings.consumed:
                    continue  # trained on (or dropped) before the resume
                async with state.changed:
                    # the window stays full to the end (its last groups may go untrained):
                    # capping production at the groups the learner needs would let one slow
                    # group stall the last steps. Dropped groups free their place, so drops
                    # never shrink the window.
                    await state.changed.wait_for(lambda: state.started - state.consumed < cap)
                    state.started += 1
                t = asyncio.create_task(group(b, i, task, w, reuse))
                running.add(t)
                t.add_done_callback(running.discard)
    except asyncio.CancelledError:
        raise
    except BaseException as exc:
        await state.fail(exc)
        raise
    finally:
        for t in list(running):
            t.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*running, return_exceptions=True)


async def _consume_step(
    learner: Learner,
    grpo: GRPOConfig,
    settings: AsyncSettings,
    state: _State,
    groups_per_step: int,
    sampler: Any,
    writer: Callable[[int], EpisodeWriter | None] | None = None,
) -> tuple[dict[str, float], list[Episode], list[Episode], list[Episode]]:
    """Fill one step with fresh-enough groups (with signal, under dynamic sampling), then
    update in a worker thread. Returns the metrics, the episodes trained on, those dropped
    as too stale and those set aside for lack of signal. Episodes the update made the
    evaluator's (a distillation teacher that could not grade them) are marked so in their
    batches' step files (`writer(b)`), here on the event loop, where the producer appends."""
    t0 = time.perf_counter()
    taken: list[list[Episode]] = []
    staleness: list[int] = []
    dropped: list[Episode] = []
    aside: list[list[Episode]] = []  # no signal (dynamic sampling)
    ds = grpo.dynamic_sampling
    may_filter = (ds.max_rounds - 1) * groups_per_step if ds is not None else 0
    while len(taken) < groups_per_step:
        async with state.changed:
            await state.changed.wait_for(lambda: state.finished or state.error is not None)
            if state.error is not None:  # a group or the producer raised
                raise state.error
            # the stalest finished group first: it is the closest to the bound, so fewer expire
            version = sampler.policy_version  # the weights do not move while a step fills
            stale = [staleness_of(g, version) for g in state.finished]
            s = max(stale)
            group = state.finished.pop(stale.index(s))
            if s > settings.max_staleness:
                state.consumed += 1  # its place in the window is free at once
                state.changed.notify_all()
                dropped += group
                continue
            if ds is not None and not has_signal(group, grpo):
                state.consumed += 1  # set aside: its place is free at once
                state.changed.notify_all()
                aside.append(group)
                if len(aside) >= may_filter:  # the cap: train on what has signal
                    break
                continue
        taken.append(group)
        # the group is kept or dropped whole (GRPO compares its members); each episode's
        # own staleness (its oldest token's) weights it
        staleness += [staleness_of([e], version) for e in group]
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
    marked = marked_by_update(taken)
    m = await asyncio.to_thread(
        update_on_groups,
        taken,
        learner,
        grpo,
        sample_weights=weights,
        lr_scale=scale,
        sampled=[*taken, *aside] if ds is not None else None,
        # under dynamic sampling every taken group was checked: it has signal
        signal=[True] * len(taken) + [False] * len(aside) if ds is not None else None,
    )
    if sampler.policy_version == version_before:  # no optimizer step ran (no eligible rows)
        sampler.policy_version += 1
    _rewrite_marked(marked(), writer)
    async with state.changed:
        # the trained groups' places are freed only now, so the groups that take them sample
        # on the new weights (freed before the update, they would sample on the old ones and
        # be a version staler when trained)
        state.consumed += len(taken)
        state.changed.notify_all()
    state.dropped_stale += len(dropped)
    m.update(
        {
            "async/staleness_mean": sum(staleness) / max(1, len(staleness)),
            "async/staleness_max": float(max(staleness, default=0)),
            "async/dropped_stale": float(len(dropped)),
            "async/dropped_stale_total": float(state.dropped_stale),
            "async/lr_scale": scale,
            "async/lr_effective": learner.cfg.lr * scale,
            "async/buffered_groups": float(len(state.finished)),
            "async/learner_wait_s": waited,
            "time/update_s": time.perf_counter() - t1,
            "train/policy_version": float(sampler.policy_version),
        }
    )
    if ds is not None:
        m["train/filtered_groups"] = float(len(aside))
    return m, [e for g in taken for e in g], dropped, [e for g in aside for e in g]


def _rewrite_marked(marked: list[Episode], writer: Any) -> None:
    """The new reward records of `marked` into their batches' step files (each batch b's
    episodes carry seed b in their ids); synchronous, so no append of the producer's (on
    the same event loop) interleaves with a rewrite."""
    if not marked or writer is None:
        return
    by_batch: dict[int, list[Episode]] = {}
    for e in marked:
        by_batch.setdefault(episode_seed_of(e.episode_id), []).append(e)
    for b, episodes in by_batch.items():
        w = writer(b)
        if w is not None:
            rewrite_rewards(w.path, episodes)
