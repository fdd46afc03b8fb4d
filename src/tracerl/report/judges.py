"""The dashboard's judges: what model judges cost, how often they failed, and whether they
agree with people (the review pool's verdicts in ``RUN/review.sqlite``).

Shown only for a run whose rewards a judge scored. Cost and failures come from the
episodes' reward breakdowns, summed per judge and rubric version; the curves of
``judge_*`` metrics (`tracerl.rewards.judge.metrics`) are in the tool-cost chart.
"""

from __future__ import annotations

import json
from typing import Any

from tracerl.report.page import esc, num, pct, table
from tracerl.report.run import RunData

AGREEMENT_FILE = "judge_agreement.json"
"""Written into the run directory by `tracerl review` and `tracerl report`
(`tracerl.judge_calibration`): each judge's agreement with the review pool."""


def agreements(d: RunData) -> list[dict[str, Any]]:
    path = d.run_dir / AGREEMENT_FILE
    try:
        rows = json.loads(path.read_text())["judges"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return [r for r in rows if isinstance(r, dict)]


def section(d: RunData) -> str:
    """Cost, failures and agreement per judge; "" when nothing was judged."""
    by: dict[tuple[str, str, str], dict[str, float]] = {}
    for e in d.episodes:
        if e.reward is None:
            continue
        for c in e.reward.judged():
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
            s["tokens"] += int(ev.get("tokens", 0))
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
            "episodes judged",
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
    found = agreements(d)
    reviewed = [a for a in found if a.get("pairs")]
    rows = [
        [
            a.get("judge", ""),
            a.get("rubric_version", ""),
            a.get("model", ""),
            a.get("pairs", 0),
            pct(a.get("accuracy")) if a.get("pairs") else "–",
            num(a.get("kappa")),
            a.get("both_correct", 0),
            a.get("both_wrong", 0),
            a.get("judge_only", 0),
            a.get("person_only", 0),
        ]
        for a in found
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
