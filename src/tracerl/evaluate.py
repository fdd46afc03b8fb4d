"""`tracerl eval`: a policy on held-out questions, scored, with metrics per split.

Runs one episode per question through the rollout engine, scores each with the layered
search reward (`tracerl.rewards.SEARCH_REWARD`), attaches the reward breakdown to every
trajectory, and writes the run directory: ``episodes/step_0.jsonl.gz`` and one line per
split in ``metrics.jsonl``:

    eval/<split>/success_rate         exact match of the final answer, over the decided
                                      episodes (absent when none decided)
    eval/<split>/searches_mean        search calls per episode
    eval/<split>/invalid_citation_rate   citations whose chain fails, over all citations of
                                      all answers (right or wrong)
    eval/<split>/evaluator_error_rate    episodes whose reward crashed (never scored 0)
    eval/<split>/latency_p95_s        95th percentile of episode wall time
    eval/<split>/reward_mean          mean total reward over eligible episodes (absent
                                      when none is)
    eval/<split>/stop/*, attribution/*   from the rollout metrics
    eval/<split>/undecided_rate, review_pending, reviewed_success_rate   the review pool:
        near misses wait in review.sqlite for a person; verdicts count once given
        (`tracerl.train.review_queue`, as in training runs)
    eval/adversarial/<kind>/success_rate  per trap kind (look_alike, dead_link, conflict,
                                          timeout — the last with half of the tool steps timing out)
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tracerl.envs import make
from tracerl.errors import UserError
from tracerl.report.sinks import append_metrics
from tracerl.rewards import SEARCH_REWARD, RewardContext, RewardSpec, compose
from tracerl.rewards.review import ReviewPool
from tracerl.rollout.budget import Budgets, RolloutConfig
from tracerl.rollout.groups import run_groups
from tracerl.rollout.persist import EpisodeWriter
from tracerl.rollout.runner import Episode, Policy
from tracerl.train.evaluation import task_batches
from tracerl.train.metrics import eval_metrics
from tracerl.train.review_queue import REVIEW_FILE, review_metrics
from tracerl.types import RewardBreakdown

EVAL_CONFIG = RolloutConfig(budgets=Budgets(steps=4, tool_calls=4), max_turn_tokens=96)


def check_search_eval(corpus: str, protocol: str, splits: list[str]) -> None:
    """Refuse search-eval arguments that name nothing (before any model loads)."""
    from tracerl.envs.search.tasks import SPLITS, splits_of

    if corpus not in ("synthetic", "wiki"):
        raise UserError(f"--corpus {corpus!r}: the search questions exist for synthetic, wiki")
    if protocol not in ("tools", "search_r1"):
        raise UserError(f"--protocol {protocol!r}: valid: tools, search_r1")
    bad = [x for x in splits if x not in splits_of(corpus)]
    if bad:
        raise UserError(
            f"--split {bad[0]!r}: corpus {corpus} has splits {', '.join(splits_of(corpus))}",
            f"the search splits are {', '.join(SPLITS)} (adversarial: synthetic only)",
        )


def evaluate(
    policy: Policy,
    *,
    corpus: str = "synthetic",
    protocol: str = "tools",
    splits: tuple[str, ...] = ("heldout",),
    n: int = 20,
    out_dir: str | Path = "runs/eval",
    seed: int = 0,
    config: RolloutConfig = EVAL_CONFIG,
    reward_spec: RewardSpec | None = None,
    progress: Any = None,
) -> dict[str, float]:
    """`progress` (a `tracerl.report.progress` object) gets one phase per split."""
    spec = reward_spec or RewardSpec.from_yaml(SEARCH_REWARD)
    probe = make("search", corpus=corpus, protocol=protocol)

    def env() -> Any:
        return make("search", corpus=corpus, protocol=protocol)

    def scorer(e: Episode) -> RewardBreakdown:
        return compose(spec, RewardContext.from_trajectories(e.trajectories, probe.document))

    out_dir = Path(out_dir)
    writer = EpisodeWriter(out_dir, step=0)
    ReviewPool(out_dir / REVIEW_FILE)  # kept even when every answer is decided
    metrics: dict[str, float] = {}
    for split in splits:
        tasks = probe.sample_tasks(n, seed=seed, split=split)
        if progress is not None:
            progress.phase(f"eval {split}", len(tasks))
        episodes: list[Episode] = []
        for _, batch, factory in task_batches(tasks, env, seed=seed):
            groups = asyncio.run(
                run_groups(
                    factory,
                    batch,
                    policy,
                    config,
                    group_size=1,
                    seed=seed,
                    on_episode=None if progress is None else progress.advance,
                    writer=writer,
                    score=scorer,
                )
            )
            episodes += [g[0] for g in groups]
        m = eval_metrics(episodes, split, probe.document)
        m.update(review_metrics(out_dir, episodes, f"eval/{split}/"))  # the review pool
        append_metrics(out_dir, {"step": 0, "split": split, **m})
        metrics.update(m)
    return metrics
