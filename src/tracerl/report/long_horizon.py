"""The dashboard's long-horizon section: what context policies and sub-agents did (the
``context/*`` metrics, `tracerl.rollout.context.metrics`) and whether compacted episodes
succeed as often as the others. Shown only for runs where an episode had more than one
sample, compacted, overflowed or delegated."""

from __future__ import annotations

from typing import Any

from tracerl.report.page import num, pct, table
from tracerl.report.run import RunData
from tracerl.report.svg import Panel, Series, line_chart

CHART = "long-horizon"
ROWS = (
    ("samples per episode", "context/samples_per_episode", num),
    ("episodes compacted", "context/compaction_rate", pct),
    ("compactions per episode", "context/compactions_mean", num),
    ("summary length (tokens the policy wrote)", "context/summary_tokens_mean", num),
    ("sub-agents per episode", "context/subagents_mean", num),
    ("episodes that overflowed their context", "context/overflow_rate", pct),
)


def _mean(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = [float(r[key]) for r in rows if key in r]
    return sum(vals) / len(vals) if vals else None


def active(d: RunData) -> bool:
    keys = ("context/compaction_rate", "context/subagents_mean", "context/overflow_rate")
    rows = d.train + d.evals
    return any(
        float(v) > 0
        for r in rows
        for k, v in r.items()
        if k.endswith(keys) or (k.endswith("context/samples_per_episode") and float(v) > 1)
    )


def section(d: RunData, number: int) -> str:
    """The chart and the table ('' for a run without long horizons)."""
    if not active(d):
        return ""
    split, ev = d.eval_split, d.last_eval(d.eval_split)
    last = d.train[-1] if d.train else {}
    rows = [
        [label, fmt(_mean(d.train, key)), fmt(last.get(key)), fmt(ev.get(f"eval/{split}/{key}"))]
        for label, key, fmt in ROWS
        if any(key in r for r in d.train) or f"eval/{split}/{key}" in ev
    ]
    for label, key in (
        ("success when compacted", "success_compacted"),
        ("success when not compacted", "success_uncompacted"),
    ):
        if any(f"train/{key}" in r for r in d.train) or f"eval/{split}/{key}" in ev:
            rows.append(
                [
                    label,
                    pct(_mean(d.train, f"train/{key}")),
                    pct(last.get(f"train/{key}")),
                    pct(ev.get(f"eval/{split}/{key}")),
                ]
            )
    chart = line_chart(
        CHART,
        f"{number} · Long horizons",
        [
            Panel(
                "samples per episode",
                [
                    Series("train", d.train_points("context/samples_per_episode")),
                    _eval(d, f"eval/{split}/context/samples_per_episode", split),
                ],
                y_min=0.0,
            ),
            Panel(
                "episodes compacted, and overflowed",
                [
                    Series("train: compacted", d.train_points("context/compaction_rate")),
                    Series(
                        "train: overflowed",
                        d.train_points("context/overflow_rate"),
                        dashed=True,
                    ),
                ],
                y_min=0.0,
                y_max=1.0,
                percent=True,
            ),
        ],
        note="A compaction or a sub-agent adds samples to an episode; the episode still "
        "counts once in its group and, under trainer.sample_weighting: episode, weighs "
        "what a one-sample episode weighs (docs/long-horizon.md).",
    )
    return f'<div class="grid2">{chart}</div>' + table(
        ["", "training (run mean)", "last step", f"last eval ({split})"], rows, {1, 2, 3}
    )


def _eval(d: RunData, key: str, name: str) -> Series:
    points, labels = d.eval_points(key, 1.0)
    return Series(name, points, labels=labels)
