"""`tracerl show`, `report`, `triage`, `replay`: reading a run directory (or a file of
trajectories) back."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tracerl.cli.common import console, fail, run_folder, write_report


def show(
    path: Annotated[Path, typer.Argument(help="a run directory, or a .jsonl[.gz] file")],
    episode: Annotated[
        str | None, typer.Argument(help="with a run directory: an episode id or replay id")
    ] = None,
    index: Annotated[int, typer.Option(help="with a file: which trajectory in it", min=0)] = 0,
) -> None:
    """Show an episode of a run, or one trajectory of a file.

    An episode: its facts, reward breakdown, steps, and tokens coloured by author."""
    from tracerl.jsonl import read_trajectories
    from tracerl.report.terminal import print_episode, print_trajectory

    if path.is_dir():  # a RunDirError or TrajectoryError is a UserError: two lines, exit 2
        from tracerl.report.run import check_run_dir, find_episode

        if episode is None:
            raise fail(
                f"{path} is a run directory: name an episode, e.g. `tracerl show {path} <id>` "
                f"(ids are listed by `tracerl triage {path}`)"
            )
        print_episode(find_episode(check_run_dir(path), episode), console)
        return
    try:
        trajs = read_trajectories(path)
    except FileNotFoundError as e:
        raise fail(str(e)) from None
    if not 0 <= index < len(trajs):
        raise fail(f"{path} holds {len(trajs)} trajectories; index {index} is out of range")
    print_trajectory(trajs[index], console)


def report(
    run: Annotated[Path, typer.Argument(help="a run directory (runs/NAME)")],
    n: Annotated[int, typer.Option("--n", help="training episodes to triage", min=1)] = 100,
) -> None:
    """Write the run's dashboard (RUN/report/index.html) and print its path.

    Self-contained and offline, with a page for each episode it links."""
    index = write_report(run, n)
    console.print(f"report: {index}", markup=False, highlight=False, soft_wrap=True)


def triage(
    run: Annotated[Path, typer.Argument(help="a run directory (runs/NAME)")],
    n: Annotated[
        int, typer.Option("--n", help="how many of the last training episodes", min=1)
    ] = 100,
) -> None:
    """Split the last N training episodes by outcome, owner and kind of failure.

    Buckets: succeeded, policy failures by kind, environment failures, evaluator failures
    or undecidable; each kind with example episode ids for `tracerl show RUN ID`."""
    from tracerl.report.run import check_run_dir, iter_episodes
    from tracerl.report.terminal import print_triage
    from tracerl.report.triage import triage as run_triage

    result = run_triage(list(iter_episodes(check_run_dir(run))), n)
    print_triage(result, console, run=run)


def replay(
    run: Annotated[Path, typer.Argument(help="a run directory (or a name under runs/)")],
    episode_id: Annotated[
        str | None,
        typer.Argument(metavar="EPISODE", help="episode id or replay id (ro_...), as for show"),
    ] = None,
    episode: Annotated[str | None, typer.Option("--episode", help="the same, as an option")] = None,
    live: Annotated[
        bool, typer.Option(help="run the recorded actions against the live env; report drift")
    ] = False,
) -> None:
    """Replay a recorded episode, exactly or against the live environment (--live).

    `tracerl replay RUN EPISODE`, as `show RUN EPISODE`. Exit 0 if it reproduces exactly
    (with --live: nothing drifted); exit 1 with the first difference otherwise. A live
    replay rebuilds the environment from the receipt (its import path too), with writes as
    dry runs."""
    import asyncio

    from tracerl.gateway.replay import replay_exact, replay_live
    from tracerl.report.run import check_run_dir, find_episode

    if (episode_id is None) == (episode is None):
        raise fail(
            "replay: name one episode: tracerl replay RUN EPISODE",
            "the episode ids are in `tracerl triage RUN` and the dashboard",
        )
    episode = episode_id or episode
    assert episode is not None
    run = run_folder(run)
    # any episode of the run: training, evaluations, the warm start's reference
    trajectories = find_episode(check_run_dir(run), episode).trajectories
    if live:
        report = asyncio.run(replay_live(trajectories))
        for d in report.steps:
            console.print(f"step {d.step}: {d.status} {d.detail}", markup=False)
        if report.drifted:
            console.print(f"{len(report.drifted)} step(s) drifted", markup=False)
            raise typer.Exit(1)
        console.print("no drift: the live environment answers as recorded")
        return
    exact = asyncio.run(replay_exact(trajectories))
    if not exact.ok:
        console.print(f"replay differs: {exact.first_difference}", markup=False)
        raise typer.Exit(1)
    console.print(
        f"{exact.episode_id}: replayed exactly (token ids, masks, stop reason "
        f"{exact.stop_reason[0] if exact.stop_reason else '?'})",
        markup=False,
    )
