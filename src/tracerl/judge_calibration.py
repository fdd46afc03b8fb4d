"""A run's judges against people: the glue between a run directory's judged episodes, its
review pool (``RUN/review.sqlite``) and the report.

The report reads the run directory alone and imports no reward code, so the agreement is
written into the run directory as ``judge_agreement.json`` whenever it can change: by
`tracerl review` (after queueing or deciding) and by `tracerl report` before it writes the
page. The computation is `tracerl.rewards.judge.calibration`.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

from tracerl.report.judges import AGREEMENT_FILE
from tracerl.report.run import EpisodeRecord, RunData
from tracerl.rewards.compose import RewardContext
from tracerl.rewards.judge.calibration import (
    JudgedAnswer,
    agreement,
    judged_answers,
    queue_for_review,
)
from tracerl.rewards.review import ReviewPool

REVIEW_FILE = "review.sqlite"


def judged_in_run(episodes: list[EpisodeRecord]) -> list[JudgedAnswer]:
    """The decided judge verdicts of a run's episodes (one per judge, task and answer)."""
    rows = []
    for e in episodes:
        r = e.reward
        if r is None or not r.judged():
            continue
        answer = RewardContext.from_trajectories(e.trajectories, lambda _: None).answer_text
        rows.append((e.episode_id, e.receipt.get("task") or {}, answer, r))
    return judged_answers(rows)


def queue_judged(run_dir: str | os.PathLike[str], n: int) -> tuple[list[JudgedAnswer], int]:
    """Queue up to `n` judged answers for people (`queue_for_review`); returns those added
    and how many judged answers the run has."""
    judged = judged_in_run(RunData.load(run_dir).episodes)
    added = queue_for_review(judged, ReviewPool(Path(run_dir) / REVIEW_FILE), n) if judged else []
    write_agreement(run_dir, judged)
    return added, len(judged)


def write_agreement(
    run_dir: str | os.PathLike[str], judged: list[JudgedAnswer] | None = None
) -> Path | None:
    """Write ``RUN/judge_agreement.json`` (each judge and rubric version: pairs, accuracy,
    kappa, counts); None, and nothing written, when no episode was judged."""
    root = Path(run_dir)
    judged = judged_in_run(RunData.load(root).episodes) if judged is None else judged
    if not judged:
        return None
    review = root / REVIEW_FILE
    # nobody has reviewed anything yet (no pool): every judge with 0 pairs
    found = agreement(judged, ReviewPool(review) if review.exists() else None)
    rows = [{**asdict(a), "accuracy": a.accuracy, "kappa": a.kappa} for a in found]
    path = root / AGREEMENT_FILE
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps({"judges": rows}, indent=1))
    tmp.replace(path)
    return path
