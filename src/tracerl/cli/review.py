"""`tracerl review`: the samples no verifier could decide, and people's verdicts on them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tracerl.cli.common import console, fail


def review(
    run: Annotated[Path, typer.Argument(help="an evaluated run directory")],
    decide: Annotated[int | None, typer.Option(help="sample id to decide")] = None,
    correct: Annotated[
        bool | None, typer.Option("--correct/--wrong", help="the verdict for --decide")
    ] = None,
    reviewer: Annotated[str, typer.Option(help="who decides")] = "",
    from_judge: Annotated[
        int | None,
        typer.Option(
            "--from-judge",
            help="queue N answers a model judge scored for people to check the judge "
            "(where it and another verifier disagree first)",
        ),
    ] = None,
) -> None:
    """List the samples no verifier could decide, or record a person's verdict on one.

    Works on a run written by `tracerl eval` (its review.sqlite), and with --from-judge on
    any run whose rewards a judge scored (the report then shows the judge's agreement)."""
    from tracerl.evaluate import reviewed_metrics
    from tracerl.judge_calibration import REVIEW_FILE
    from tracerl.rewards.review import ReviewPool

    path = run / REVIEW_FILE
    if from_judge is not None:
        _queue_judged(run, from_judge)
    if not path.exists():
        raise fail(
            f"{run}: no review.sqlite",
            "the review pool is kept by `tracerl eval --out DIR` on the search questions "
            "(without a CONFIG), or filled from a judge's verdicts with --from-judge N",
        )
    pool = ReviewPool(path)
    if decide is not None:
        if correct is None or not reviewer:
            raise fail("--decide needs --correct or --wrong, and --reviewer NAME")
        try:
            s = pool.decide(decide, correct, reviewer)
        except KeyError as e:
            raise fail(str(e.args[0])) from None
        console.print(
            f"sample {s.id}: {'correct' if s.verdict else 'wrong'} by {s.reviewer}", markup=False
        )
        from tracerl.report.judges import AGREEMENT_FILE

        if (run / AGREEMENT_FILE).exists():  # a judge's agreement with people may change
            from tracerl.judge_calibration import write_agreement

            write_agreement(run)
    pending = pool.samples(pending_only=True)
    for s in pending:
        console.print(
            f"[{s.id}] {s.question}\n    answer: {s.answer!r}   gold: {s.golds}", markup=False
        )
    console.print(f"{len(pending)} pending", markup=False)
    for key, value in sorted(reviewed_metrics(run).items()):
        console.print(f"{key:45s} {value:.3f}", markup=False)


def _queue_judged(run: Path, n: int) -> None:
    from tracerl.judge_calibration import queue_judged
    from tracerl.report.run import RunDirError

    if n < 1:
        raise fail(f"--from-judge {n}: give a positive number of answers to queue")
    try:
        added, judged = queue_judged(run, n)
    except RunDirError as e:
        raise fail(str(e)) from None
    if not judged:
        raise fail(
            f"{run}: no episode has a judge's verdict",
            "score with a judge (a reward component with fn: judge, docs/judges.md)",
        )
    console.print(
        f"queued {len(added)} of {judged} judged answers for review "
        f"({sum(j.other is not None and j.other != j.says_correct for j in added)} where the "
        "judge and another verifier disagree)",
        markup=False,
    )
