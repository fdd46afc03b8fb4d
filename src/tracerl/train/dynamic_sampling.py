"""No step without signal: dynamic sampling (DAPO, arXiv:2503.14476; veRL's
``algorithm.filter_groups``).

A group whose advantages are all zero (every eligible member scored the same, or fewer than
two are eligible) teaches nothing: GRPO compares members, and there is nothing to compare.
With dynamic sampling a step keeps sampling until it has its quota of informative groups::

    round 1: the step's tasks, one group each (quota = their number)
    while fewer than quota groups have signal and rounds < max_rounds:
        replacement tasks (a function of the seed, the step and the round; none drawn
        before in this step), as many as the informative rate so far says are needed
    update on the first `quota` informative groups, in the order they were drawn (fewer if
    the cap was reached: the step trains on what it has; none: no update)

Every group sampled is written to the run directory and counted: the step's
``train/zero_signal_group_rate`` is over all its sampled groups, ``train/resampled_groups``
says how many replacements it drew, ``train/sampling_rounds`` how many rounds, and
``train/filtered_groups`` how many groups the update left out. Replacement groups take the
positions after the step's own (``<task>:s<step>:t<position>:g<member>``), so their episode
ids never collide, and a resumed step redraws the same replacements and reuses the episodes
already on disk.

The asynchronous loop filters the same way as it takes finished groups
(`tracerl.train.async_loop`): a zero-signal group is set aside and its place in the window
freed, up to ``(max_rounds - 1) x quota`` per step.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tracerl.rollout.episode import episode_seed
from tracerl.rollout.runner import Episode

Group = list[Episode]
RunRound = Callable[[list[dict[str, Any]], int], Awaitable[list[Group]]]
"""Run one group per task, the first at the given position in the step."""
Refill = Callable[[int, int, set[str]], list[dict[str, Any]]]
"""``refill(round, n, drawn_ids)``: `n` replacement tasks for `round` (2, 3, ...), none of
whose ids is in `drawn_ids`; deterministic, so a resume draws the same."""


@dataclass(frozen=True)
class DynamicSampling:
    max_rounds: int = 3
    """Sampling rounds per step, the first included (veRL's ``max_num_gen_batches``):
    the cap on resampling."""
    max_oversample: float = 2.0
    """A replacement round draws at most this many times the step's quota of groups."""

    @classmethod
    def of(cls, config: Any) -> DynamicSampling | None:
        """From ``trainer.dynamic_sampling`` (None: off)."""
        return None if config is None else cls(config.max_rounds, config.max_oversample)


@dataclass
class Sampled:
    """A step's sampling: the groups to train on, and everything it drew."""

    train: list[Group]
    drawn: list[Group]
    signal: list[bool]
    rounds: int
    quota: int

    def metrics(self, dynamic: bool) -> dict[str, float]:
        """What the step sampled; with dynamic sampling (`dynamic`), what the filter did:
        replacement groups, rounds, groups set aside without signal, and informative groups
        sampled beyond the quota (the last round's overshoot, not trained on either)."""
        m = {
            "train/sampled_groups": float(len(self.drawn)),
            "train/episodes_sampled": float(sum(len(g) for g in self.drawn)),
        }
        if dynamic:
            m |= {
                "train/resampled_groups": float(len(self.drawn) - self.quota),
                "train/sampling_rounds": float(self.rounds),
                "train/informative_groups": float(sum(self.signal)),
                "train/filtered_groups": float(len(self.signal) - sum(self.signal)),
                "train/surplus_groups": float(sum(self.signal) - len(self.train)),
            }
        return m


def replacement_tasks(
    cfg: Any, probe: Any, step: int, round_: int, n: int, drawn: set[str]
) -> list[dict[str, Any]]:
    """`tracerl train`'s replacement tasks for round `round_` (2, 3, ...) of step `step`
    (`cfg` the run's config, `probe` its environment): a function of the seed, the step and
    the round (a resume draws the same), none already drawn in the step. Fewer than `n`
    when the split runs out."""
    # a stream of its own: an arithmetic seed such as (seed, step) -> 101 * step + round
    # would be another step's seed, and replay that step's tasks
    seed = episode_seed(cfg.trainer.seed, "refill", step, round_)
    pool = probe.sample_tasks(n + len(drawn), seed=seed, split=cfg.env.train_split)
    return [task for task in pool if str(task.get("id")) not in drawn][:n]


def replacements_needed(quota: int, informative: int, drawn: int, cap: int) -> int:
    """How many groups the next round draws: the missing ones divided by the informative
    rate so far (at least the missing ones, at most `cap`)."""
    missing = quota - informative
    if missing <= 0:
        return 0
    rate = informative / drawn if drawn else 1.0
    wanted = math.ceil(missing / rate) if rate > 0 else cap
    return max(missing, min(wanted, cap))


async def sample_with_signal(
    tasks: Sequence[dict[str, Any]],
    run_round: RunRound,
    has_signal: Callable[[Group], bool],
    settings: DynamicSampling | None,
    refill: Refill | None,
) -> Sampled:
    """The step's groups (see the module docstring). Without `settings` (or `refill`): one
    round, every group trained on."""
    quota, ids = len(tasks), {str(t.get("id")) for t in tasks}
    drawn = await run_round(list(tasks), 0)
    signal = [has_signal(g) for g in drawn]
    rounds = 1
    if settings is not None and refill is not None:
        cap = max(1, math.ceil(settings.max_oversample * quota))
        while sum(signal) < quota and rounds < settings.max_rounds:
            n = replacements_needed(quota, sum(signal), len(drawn), cap)
            more = refill(rounds + 1, n, set(ids))
            if not more:  # the split has nothing left to draw
                break
            rounds += 1
            ids |= {str(t.get("id")) for t in more}
            groups = await run_round(more, len(drawn))
            drawn += groups
            signal += [has_signal(g) for g in groups]
        train = [g for g, ok in zip(drawn, signal, strict=True) if ok][:quota]
    else:
        train = list(drawn)
    return Sampled(train, drawn, signal, rounds, quota)
