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
            min=1,
        ),
    ] = None,
) -> None:
    """List the samples no verifier could decide, or record a person's verdict on one.

    Works on any run written by `tracerl train` or `tracerl eval` (episodes whose reward
    could not decide wait in its review.sqlite), and with --from-judge on any run whose
    rewards a judge scored (the report then shows the judge's agreement)."""
    from tracerl.judge_calibration import REVIEW_FILE
    from tracerl.rewards.review import ReviewPool
    from tracerl.train.review_queue import reviewed_metrics

    path = run / REVIEW_FILE
    if from_judge is not None:
        _queue_judged(run, from_judge)
    if not path.exists():
        if decide is None and (run / "metrics.jsonl").is_file():  # a run: nothing undecided
            console.print(
                f"0 pending: no episode of {run} was left undecided (its rewards all decided)",
                markup=False,
            )
            return
        raise fail(
            f"{run}: no review.sqlite",
            "the review pool is kept in the run directory by `tracerl train` and "
            "`tracerl eval` (episodes whose reward could not decide), or filled from a "
            "judge's verdicts with --from-judge N",
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
        line = f"[{s.id}] {s.question}\n    answer: {s.answer!r}"
        if s.golds or "undecided" not in s.evidence:  # a run's generic task may have none
            line += f"   gold: {s.golds}"
        reply = s.evidence.get("last_reply")
        if not s.answer and isinstance(reply, str):  # never answered: what it last said
            line += f"   (no answer; its last reply: {reply[-120:]!r})"
        console.print(line, markup=False)
        if why := _why(s.evidence):
            console.print(f"    {why}", markup=False)
    console.print(f"{len(pending)} pending", markup=False)
    for key, value in sorted(reviewed_metrics(run).items()):
        shown = "undefined (nothing decided yet)" if value is None else f"{value:.3f}"
        console.print(f"{key:45s} {shown}", markup=False)


def _why(evidence: dict) -> str:
    """What the components that could not decide said (a run's undecided episode), short."""
    import json

    names = evidence.get("undecided")
    if not isinstance(names, list) or not names:
        return ""
    said = {n: evidence.get(n) for n in names if evidence.get(n)}
    text = f"undecided: {', '.join(map(str, names))}"
    if said:
        text += " " + json.dumps(said, default=str, ensure_ascii=False)
    return text if len(text) <= 300 else text[:297] + "..."


def _queue_judged(run: Path, n: int) -> None:
    from tracerl.judge_calibration import queue_judged

    # a folder that is no run: a RunDirError, two lines (its hint names runs below it)
    added, judged = queue_judged(run, n)
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
