"""`tracerl eval`: a policy on held-out questions, scored, with metrics per split.

Runs one episode per question through the rollout engine, scores each with the layered
search reward (`tracerl.rewards.SEARCH_REWARD`), attaches the reward breakdown to every
trajectory, and writes the run directory: ``episodes/step_0.jsonl.gz`` and one line per
split in ``metrics.jsonl``:

    eval/<split>/success_rate         exact match of the final answer
    eval/<split>/searches_mean        search calls per episode
    eval/<split>/invalid_citation_rate   citations whose chain fails, over all citations of
                                      all answers (right or wrong)
    eval/<split>/evaluator_error_rate    episodes whose reward crashed (never scored 0)
    eval/<split>/latency_p95_s        95th percentile of episode wall time
    eval/<split>/reward_mean          mean total reward over eligible episodes
    eval/<split>/stop/*, attribution/*   from the rollout metrics
    eval/<split>/undecided_rate, review_pending, reviewed_success_rate   the review pool:
        near misses wait in review.sqlite for a person; verdicts count once given
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
    pool = ReviewPool(out_dir / "review.sqlite")
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
        m.update(_review(pool, episodes, split))
        append_metrics(out_dir, {"step": 0, "split": split, **m})
        metrics.update(m)
    return metrics


def _review(pool: ReviewPool, episodes: list[Episode], split: str) -> dict[str, float]:
    """Undecided answers go to the review pool; verdicts already given count as decided."""
    success = undecided = pending = 0
    for e in episodes:
        r = e.reward
        assert r is not None, "evaluate scores every episode"
        em = r.component("em")
        if r.error is not None or em.gated:
            continue
        if em.decided:
            success += em.value >= 1.0
            continue
        undecided += 1
        answer = str(em.evidence.get("answer", ""))
        pool.add(episode_id=e.episode_id, task=e.receipt.task, answer=answer, evidence=em.evidence)
        verdict = pool.verdict(e.receipt.task, answer)
        pending += verdict is None
        success += bool(verdict)
    n = max(1, len(episodes))
    return {
        f"eval/{split}/undecided_rate": undecided / n,
        f"eval/{split}/review_pending": float(pending),
        f"eval/{split}/reviewed_success_rate": success / n,
    }


def reviewed_metrics(run_dir: str | Path) -> dict[str, float]:
    """Success per split of an evaluated run, counting the review pool's verdicts."""
    from tracerl.rollout.persist import read_run_trajectories

    pool = ReviewPool(Path(run_dir) / "review.sqlite")
    seen: dict[str, dict[str, Any]] = {}
    for _, t in read_run_trajectories(run_dir):
        if t.reward and t.receipt:
            seen[t.episode_id or ""] = {"task": t.receipt["task"], "reward": t.reward}
    totals: dict[str, list[float]] = {}
    for item in seen.values():
        task, reward = item["task"], item["reward"]
        em = next((c for c in reward["components"] if c["name"] == "em"), None)
        ok = 0.0
        if em and not em["gated"]:
            if em["decided"]:
                ok = float(em["value"] >= 1.0)
            else:
                ok = float(bool(pool.verdict(task, str(em["evidence"].get("answer", "")))))
        totals.setdefault(task.get("split", "unknown"), []).append(ok)
    return {f"eval/{s}/reviewed_success_rate": sum(v) / len(v) for s, v in totals.items()}
