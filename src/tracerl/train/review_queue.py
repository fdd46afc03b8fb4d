"""The review pool, filled by runs: every episode whose reward could not decide waits for a
person in ``RUN/review.sqlite`` (`tracerl.rewards.review.ReviewPool`), and people's verdicts
count in the evaluations' metrics.

An episode is *undecided* when its reward breakdown is not decided and its evaluator did not
crash (a crash is the evaluator's error, for `tracerl triage`, not a question for a person):
a reward function that returned None, a judge that could not decide, a near miss of exact
match. Training steps (`queue_undecided`, from the loop) and evaluations (`review_metrics`,
from `tracerl.train.evaluation` and `tracerl.evaluate`) queue theirs with their evidence:

    question   the task's text: its ``question`` (or ``prompt``, ``instruction``, ``input``,
               ``query``) field, else the task as JSON (without its id, split and reference
               answers) — `tracerl.rewards.judge.calibration.review_task`
    answer     the episode's final answer text ("" when it never answered)
    golds      the task's reference answers (``answers``, ``answer``, ``target(s)``), if any
    evidence   each scored component's evidence, by component name, and which components
               were left undecided (with the model's last reply when the episode gave no
               answer)

keyed as the pool keys them: the same answer (normalised) to the same task is asked once, and
a verdict given once counts for every episode that gave it. The pool is created with the
first undecided episode: a run whose rewards all decided has none.

An evaluation reports, beside ``undecided_rate`` (`tracerl.train.metrics`):

    review_pending          its undecided episodes no person has decided yet (a count)
    reviewed_success_rate   success where a person's verdict on the episode's answer to its
                            task counts as the decided outcome (whatever the reward said: a
                            person may check a judge's verdicts too), over the episodes
                            decided either way (the pending ones are left out, never counted
                            as failures); absent when there are none

and `reviewed_metrics` recomputes the last one from the run directory once verdicts come in
(`tracerl review RUN`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tracerl.report.run import iter_episodes, metric_rows
from tracerl.rewards.compose import RewardContext
from tracerl.rewards.judge.calibration import review_task
from tracerl.rewards.review import ReviewPool, key
from tracerl.types import RewardBreakdown, Trajectory

REVIEW_FILE = "review.sqlite"

_STAGES = {"baseline": 0, "warm_start": 1}  # evaluations at one step: their order


def undecided(reward: RewardBreakdown | None) -> bool:
    """Waits for a person: the reward could not decide, its evaluator healthy."""
    return reward is not None and not reward.decided and reward.error is None


def _context(trajectories: Sequence[Trajectory]) -> RewardContext:
    """The episode as its reward read it (its final answer, its last reply)."""
    return RewardContext.from_trajectories(trajectories, lambda _: None)


def final_answer(trajectories: Sequence[Trajectory]) -> str:
    """The episode's final answer text, as the pool keys it ("" when it never answered)."""
    return _context(trajectories).answer_text


def evidence_of(reward: RewardBreakdown, ctx: RewardContext) -> dict[str, Any]:
    """What the reward saw: each scored component's evidence (by name), and which of them
    could not decide (`ctx`: the episode, `_context`)."""
    out: dict[str, Any] = {c.name: c.evidence for c in reward.components if not c.gated}
    out["undecided"] = [c.name for c in reward.components if not c.decided and not c.gated]
    if not ctx.answer_text and ctx.last_sampled_text:  # no answer: what the model last said
        out["last_reply"] = ctx.last_sampled_text[-2000:]
    return out


def queue_undecided(run_dir: str | os.PathLike[str], episodes: Iterable[Any]) -> int:
    """Queue `episodes`' undecided ones in ``run_dir/review.sqlite`` (created then); returns
    how many were new to the pool (an answer already queued for its task is not asked
    again)."""
    waiting = [e for e in episodes if undecided(e.reward)]
    if not waiting:
        return 0
    pool = ReviewPool(Path(run_dir) / REVIEW_FILE)
    added = 0
    for e in waiting:
        ctx = _context(e.trajectories)  # read once: the answer and the evidence
        added += pool.add(
            episode_id=e.episode_id,
            task=review_task(e.receipt.task),
            answer=ctx.answer_text,
            evidence=evidence_of(e.reward, ctx),
        )
    return added


def review_metrics(
    run_dir: str | os.PathLike[str], episodes: Sequence[Any], prefix: str = ""
) -> dict[str, float]:
    """Queue an evaluation's undecided episodes (`queue_undecided`) and measure them:
    ``<prefix>review_pending`` and ``<prefix>reviewed_success_rate`` (see the module
    docstring)."""
    queue_undecided(run_dir, episodes)
    verdicts = _verdicts(run_dir)
    pending, outcomes = 0, []
    for e in episodes:
        ok = reviewed_outcome(e.reward, e.receipt.task, e.trajectories, verdicts)
        pending += ok is None and undecided(e.reward)
        if ok is not None:
            outcomes.append(float(ok))
    m = {f"{prefix}review_pending": float(pending)}
    if outcomes:
        m[f"{prefix}reviewed_success_rate"] = sum(outcomes) / len(outcomes)
    return m


def _verdicts(run_dir: str | os.PathLike[str]) -> dict[str, bool]:
    path = Path(run_dir) / REVIEW_FILE
    return ReviewPool(path).verdicts() if path.exists() else {}


def reviewed_outcome(
    reward: RewardBreakdown | None,
    task: dict[str, Any],
    trajectories: Sequence[Trajectory],
    verdicts: dict[str, bool],
) -> bool | None:
    """Did the episode succeed, as people reviewed it? A person's verdict on its answer to
    its task (`verdicts`: the pool's, `ReviewPool.verdicts`) whatever its reward said (a
    person checks a judge too: ``tracerl review --from-judge``), else its reward's decided
    outcome. None: undecided with no verdict yet (pending), the evaluator crashed, or it is
    unscored."""
    if verdicts:
        said = verdicts.get(key(review_task(task), final_answer(trajectories)))
        if said is not None:
            return said
    if reward is None or not reward.decided:
        return None
    return reward.succeeded


def reviewed_metrics(run_dir: str | os.PathLike[str]) -> dict[str, float | None]:
    """``eval/<split>/reviewed_success_rate`` of each split's latest evaluation in the run
    directory, counting the pool's verdicts as they stand now (None: nothing decided yet).
    The split is where the episode was written: a training run's (or `tracerl eval
    CONFIG`'s) ``eval/`` folder is the config's ``env.eval_split``, ``eval/adversarial`` the
    adversarial split; the episodes of `tracerl eval` without a CONFIG carry theirs in the
    task."""
    import yaml

    root = Path(run_dir)
    verdicts = _verdicts(root)
    cfg_path = root / "config.yaml"
    cfg = yaml.safe_load(cfg_path.read_text()) if cfg_path.exists() else None
    env = (cfg or {}).get("env") if isinstance(cfg, dict) else None
    eval_split = str((env or {}).get("eval_split", "heldout"))
    # per split: the latest evaluation's episodes (by id: a rewritten episode counts once)
    latest: dict[str, tuple[tuple[int, int], dict[str, Any]]] = {}
    for e in iter_episodes(root, metric_rows(root)):
        if e.phase != "eval":
            continue
        split = e.split
        if split == "heldout" and e.where_in_run.startswith("eval/"):
            split = eval_split  # the run's own eval folder holds its eval split
        when = (e.step, _STAGES.get(e.stage, 2))
        held = latest.get(split)
        if held is None or when > held[0]:
            held = latest[split] = (when, {})
        if when == held[0]:
            held[1][e.episode_id] = e
    out: dict[str, float | None] = {}
    for split, (_, by_id) in sorted(latest.items()):
        seen = [
            reviewed_outcome(e.reward, e.task, e.trajectories, verdicts) for e in by_id.values()
        ]
        oks = [float(x) for x in seen if x is not None]
        out[f"eval/{split}/reviewed_success_rate"] = sum(oks) / len(oks) if oks else None
    return out
