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
import dataclasses
import math
from pathlib import Path
from typing import Any

from tracerl.envs import FaultInjector, make
from tracerl.rewards import SEARCH_REWARD, RewardContext, RewardSpec, compose, verify_citation
from tracerl.rewards.review import ReviewPool
from tracerl.rollout.budget import Budgets, RolloutConfig
from tracerl.rollout.groups import rollout_metrics, run_groups
from tracerl.rollout.persist import EpisodeWriter, append_metrics
from tracerl.rollout.runner import Episode, Policy
from tracerl.types import RewardBreakdown

EVAL_CONFIG = RolloutConfig(budgets=Budgets(steps=4, tool_calls=4), max_turn_tokens=96)


def _p95(values: list[float]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


def split_metrics(
    episodes: list[Episode],
    rewards: list[RewardBreakdown],
    split: str,
    contexts: list[RewardContext],
) -> dict[str, float]:
    em = [
        c.value if c.decided and not c.gated else 0.0 for c in (r.component("em") for r in rewards)
    ]
    # every citation of every answer, wrong answers included (not only those the reward's
    # gates let through): invalid citations matter most where the answer is wrong
    verdicts = [
        verify_citation(c, str(ctx.answer.get("text") or ""), ctx.lookup)
        for ctx in contexts
        if ctx.answer
        for c in ctx.answer.get("citations") or []
    ]
    searches = [
        sum(1 for s in e.steps for c in s.get("calls", []) if c["action"]["tool"] == "search")
        for e in episodes
    ]
    eligible = [r.total for r in rewards if r.eligible]
    n = max(1, len(episodes))
    m = {
        "success_rate": sum(em) / n,
        "searches_mean": sum(searches) / n,
        "invalid_citation_rate": (
            sum(not v["valid"] for v in verdicts) / len(verdicts) if verdicts else 0.0
        ),
        "citations": float(len(verdicts)),
        "latency_p95_s": _p95([e.receipt.wall_time_s or 0.0 for e in episodes]),
        "reward_mean": sum(eligible) / len(eligible) if eligible else 0.0,
        "evaluator_error_rate": sum(r.error is not None for r in rewards) / n,
        "episodes": float(len(episodes)),
    }
    for name in [c.name for c in rewards[0].components] if rewards else []:
        values = [  # each reward component as its own metric, over the episodes it scored
            c.value
            for r in rewards
            for c in r.components
            if c.name == name and c.decided and not c.gated
        ]
        if values:
            m[f"reward/{name}"] = sum(values) / len(values)
    m.update(
        {
            k: v
            for k, v in rollout_metrics(episodes).items()
            if k.split("/")[0] in ("stop", "attribution")
        }
    )
    return {f"eval/{split}/{k}": v for k, v in m.items()}


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
    out_dir = Path(out_dir)
    writer = EpisodeWriter(out_dir, step=0)
    pool = ReviewPool(out_dir / "review.sqlite")
    metrics: dict[str, float] = {}
    for split in splits:
        tasks = probe.sample_tasks(n, seed=seed, split=split)
        if progress is not None:
            progress.phase(f"eval {split}", len(tasks))
        episodes: list[Episode] = []
        for kind, batch in _batches(tasks, split):
            factory = _env_factory(corpus, protocol, timeouts=kind == "timeout", seed=seed)
            groups = asyncio.run(
                run_groups(
                    factory,
                    batch,
                    policy,
                    config,
                    group_size=1,
                    seed=seed,
                    on_episode=None if progress is None else progress.advance,
                )
            )
            episodes += [g[0] for g in groups]
        rewards, contexts = [], []
        for e in episodes:
            ctx = RewardContext.from_trajectories(e.trajectories, probe.document)
            r = compose(spec, ctx)
            rewards.append(r)
            contexts.append(ctx)
            writer.append(
                dataclasses.replace(t, reward=r.to_dict(), _cache={}) for t in e.trajectories
            )
        m = split_metrics(episodes, rewards, split, contexts)
        m.update(_review(pool, episodes, rewards, split))
        if split == "adversarial":
            m.update(_per_kind(episodes, rewards))
        append_metrics(out_dir, {"step": 0, "split": split, **m})
        metrics.update(m)
    return metrics


def _batches(tasks: list[dict[str, Any]], split: str) -> list[tuple[str, list[dict[str, Any]]]]:
    """Adversarial tasks run per kind (timeouts need a fault-injecting env); others at once."""
    if split != "adversarial":
        return [("", tasks)]
    kinds = sorted({t["kind"] for t in tasks})
    return [(k, [t for t in tasks if t["kind"] == k]) for k in kinds]


def _env_factory(corpus: str, protocol: str, *, timeouts: bool, seed: int) -> Any:
    def factory() -> Any:
        env = make("search", corpus=corpus, protocol=protocol)
        if timeouts:  # half of the tool steps time out; retries may recover
            return FaultInjector(env, rate=0.5, kinds=["timeout"], seed=seed)
        return env

    return factory


def _per_kind(episodes: list[Episode], rewards: list[RewardBreakdown]) -> dict[str, float]:
    out: dict[str, float] = {}
    for kind in sorted({e.receipt.task.get("kind", "") for e in episodes}):
        idx = [i for i, e in enumerate(episodes) if e.receipt.task.get("kind") == kind]
        em = [rewards[i].component("em") for i in idx]
        out[f"eval/adversarial/{kind}/success_rate"] = sum(
            c.value for c in em if not c.gated
        ) / len(idx)
    return out


def _review(
    pool: ReviewPool, episodes: list[Episode], rewards: list[RewardBreakdown], split: str
) -> dict[str, float]:
    """Undecided answers go to the review pool; verdicts already given count as decided."""
    success = undecided = pending = 0
    for e, r in zip(episodes, rewards, strict=True):
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
