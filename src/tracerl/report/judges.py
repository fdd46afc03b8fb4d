"""The dashboard's judges: what model judges cost, how often they failed, and whether they
agree with people (the review pool's verdicts in ``RUN/review.sqlite``).

Shown only for a run whose rewards a judge scored. Cost and failures come from the
episodes' reward breakdowns, summed per judge and rubric version; the curves of
``judge_*`` metrics (`tracerl.rewards.judge.metrics`) are in the tool-cost chart.
"""

from __future__ import annotations

from pathlib import Path

from tracerl.report.page import esc, num, pct, table
from tracerl.report.run import EpisodeRecord, RunData
from tracerl.rewards.compose import RewardContext
from tracerl.rewards.judge.calibration import Agreement, JudgedAnswer, agreement, judged_answers
from tracerl.rewards.judge.metrics import judged
from tracerl.rewards.review import ReviewPool

REVIEW_FILE = "review.sqlite"


def judged_in_run(episodes: list[EpisodeRecord]) -> list[JudgedAnswer]:
    """The decided judge verdicts of a run's episodes (one per judge, task and answer)."""
    rows = []
    for e in episodes:
        if e.reward is None or not any(judged(e.reward)):
            continue
        answer = RewardContext.from_trajectories(e.trajectories, lambda _: None).answer_text
        rows.append((e.episode_id, e.receipt.get("task") or {}, answer, e.reward))
    return judged_answers(rows)


def agreement_in_run(run_dir: Path, episodes: list[EpisodeRecord]) -> list[Agreement]:
    """Each judge's agreement with the run's review pool (empty pool: 0 pairs each)."""
    path = Path(run_dir) / REVIEW_FILE
    answers = judged_in_run(episodes)
    if not path.exists():  # no person has reviewed anything: 0 pairs each
        names = sorted({(a.judge, a.rubric_version, a.model) for a in answers})
        return [Agreement(n, v, m, 0, 0, 0, 0, 0) for n, v, m in names]
    return agreement(answers, ReviewPool(path))


def section(d: RunData) -> str:
    """Cost, failures and agreement per judge; "" when nothing was judged."""
    by: dict[tuple[str, str, str], dict[str, float]] = {}
    for e in d.episodes:
        if e.reward is None:
            continue
        for c in judged(e.reward):
            ev = c.evidence
            key = (str(ev["judge"]), str(ev.get("rubric_version", "")), str(ev.get("model", "")))
            s = by.setdefault(
                key,
                dict.fromkeys(
                    ("n", "requests", "tokens", "latency", "cached", "failed", "refused"), 0.0
                ),
            )
            s["n"] += 1
            s["requests"] += int(ev.get("attempts", 0))
            s["tokens"] += (
                int(ev["tokens"])
                if "tokens" in ev
                else int(ev.get("prompt_tokens", 0)) + int(ev.get("completion_tokens", 0))
            )
            s["latency"] += float(ev.get("latency_s", 0.0))
            s["cached"] += bool(ev.get("cached"))
            failed = not c.decided and "error" in ev
            s["failed"] += failed
            s["refused"] += failed and "budget" in ev
    if not by:
        return ""
    cost = table(
        [
            "judge",
            "rubric version",
            "model",
            "verdicts asked",
            "requests",
            "tokens",
            "tokens / verdict",
            "latency (s)",
            "cache hits",
            "failed",
            "of which budget",
        ],
        [
            [
                name,
                version,
                model,
                int(s["n"]),
                int(s["requests"]),
                int(s["tokens"]),
                f"{s['tokens'] / s['n']:.0f}",
                f"{s['latency']:.1f}",
                pct(s["cached"] / s["n"]),
                f"{int(s['failed'])} ({pct(s['failed'] / s['n'])})",
                int(s["refused"]),
            ]
            for (name, version, model), s in sorted(by.items())
        ],
        num={3, 4, 5, 6, 7, 8, 9, 10},
    )
    last = d.train[-1] if d.train else {}
    ev = d.last_eval(d.eval_split)
    split = d.eval_split
    curves = table(
        ["judge failure rate", "training (run)", "last step", f"last eval ({split})"],
        [
            [
                "judged components left undecided",
                pct(_mean(d, "train/judge_failure_rate")),
                pct(last.get("train/judge_failure_rate")),
                pct(ev.get(f"eval/{split}/judge_failure_rate")),
            ]
        ],
        num={1, 2, 3},
    )
    agreements = agreement_in_run(d.run_dir, d.episodes)
    reviewed = [a for a in agreements if a.pairs]
    rows = [
        [
            a.judge,
            a.rubric_version,
            a.model,
            a.pairs,
            pct(a.accuracy) if a.pairs else "–",
            num(a.kappa),
            a.both_correct,
            a.both_wrong,
            a.judge_only,
            a.person_only,
        ]
        for a in agreements
    ]
    calibration = table(
        [
            "judge",
            "rubric version",
            "model",
            "reviewed pairs",
            "accuracy",
            "Cohen's kappa",
            "both correct",
            "both wrong",
            "judge only",
            "person only",
        ],
        rows,
        num={3, 4, 5, 6, 7, 8, 9},
    )
    hint = (
        "No person has reviewed a judged answer yet: "
        f"<code>tracerl review {esc(d.run_dir)} --from-judge 20</code> queues the most "
        "telling ones (the judge against the other verifier first), then "
        "<code>--decide ID --correct|--wrong --reviewer NAME</code>."
        if not reviewed
        else "Pairs: a judged answer a person also decided (the judge says correct when its "
        "verdict reaches its threshold). Kappa discounts the agreement two raters would reach "
        "by chance; '–' when every verdict was alike. A reworded rubric (another version) is "
        "another judge: it is calibrated anew."
    )
    return (
        cost
        + curves
        + "<h3>Agreement with people</h3>"
        + calibration
        + f'<p class="note">{hint}</p>'
        + '<p class="note">A judge failure (timeout, endpoint error, a reply that is no '
        "verdict, the step's budget spent) leaves the episode undecided and the evaluator's: "
        "it is never trained on as a 0.</p>"
    )


def _mean(d: RunData, key: str) -> float | None:
    vals = [float(r[key]) for r in d.train if key in r]
    return sum(vals) / len(vals) if vals else None
