"""The dashboard's distillation section (``trainer.distill``): how far the student is from its
teacher, how much of what it wrote the teacher graded, and what grading cost — beside, never
instead of, the held-out curve. Shown only for runs that distilled."""

from __future__ import annotations

from collections.abc import Callable

from tracerl.report.page import num, pct, table
from tracerl.report.run import RunData
from tracerl.report.svg import Panel, Series, line_chart

CHART = "distillation"


def active(d: RunData) -> bool:
    return any("train/distill/reverse_kl" in r for r in d.train)


def section(d: RunData, number: int) -> str:
    """The chart and a table of first and last steps ('' for a run that did not distill)."""
    if not active(d):
        return ""
    first, last = d.train[0], d.train[-1]

    def row(label: str, key: str, fmt: Callable[[float | None], str] = num) -> list[str]:
        return [label, fmt(first.get(key)), fmt(last.get(key))]

    rows = [
        row("reverse KL to the teacher, per policy token", "train/distill/reverse_kl"),
        row("reverse KL to the teacher, per turn", "train/distill/reverse_kl_turn"),
        row("policy tokens the teacher graded", "train/distill/coverage", pct),
        row("samples the teacher failed (left out)", "train/distill/teacher_failures"),
        row("samples past the step's teacher budget (left out)", "train/distill/budget_refusals"),
        row("tokens the teacher ran", "train/distill/teacher_tokens"),
        row("teacher time per step (s)", "time/teacher_s"),
    ]
    chart = line_chart(
        CHART,
        f"{number} · Distillation",
        [
            Panel(
                "reverse KL(student ‖ teacher) per policy token",
                [Series("KL", d.train_points("train/distill/reverse_kl"))],
            ),
            Panel(
                "policy tokens graded by the teacher",
                [Series("coverage", d.train_points("train/distill/coverage"))],
                y_min=0.0,
                percent=True,
            ),
            Panel(
                "samples left out (teacher failed, budget spent)",
                [
                    Series("failed", d.train_points("train/distill/teacher_failures")),
                    Series(
                        "over budget",
                        d.train_points("train/distill/budget_refusals"),
                        dashed=True,
                    ),
                ],
                y_min=0.0,
            ),
            Panel(
                "tokens the teacher ran per step",
                [Series("teacher tokens", d.train_points("train/distill/teacher_tokens"))],
                y_min=0.0,
            ),
        ],
        note="The teacher scores only the tokens the student wrote, in the context it saw; "
        "the KL is the mean of log p_student − log p_teacher over them (an unbiased estimate "
        "on the student's own samples). A falling KL is the student nearing the teacher; "
        "whether that helps is the held-out curve's to say. A sample the teacher could not "
        "grade is the evaluator's and trains on nothing.",
    )
    return chart + table(["", "first step", "last step"], rows)
