"""Terminal views: a trajectory with every token coloured by its author (`tracerl show`),
a whole episode of a run with its steps and reward (`tracerl show RUN EPISODE`), and the
triage tables (`tracerl triage RUN`)."""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from tracerl.report.run import EpisodeRecord, eval_history, sample_origin
from tracerl.report.triage import BUCKETS, Triage, classify, describe
from tracerl.report.viewer import action_text, agent_text, observation_text
from tracerl.types import Source, Trajectory

STYLE = {
    Source.PROMPT: "dim",
    Source.TEMPLATE: "magenta",
    Source.POLICY: "bold green",
    Source.ENVIRONMENT: "cyan",
    Source.ECHO: "yellow strike",
}


def trajectory_summary(traj: Trajectory) -> dict[str, Any]:
    """Token counts per source and the loss-token total, as plain numbers."""
    counts = {s.value: traj.count(s) for s in Source}
    return {
        "tokens": len(traj),
        "loss_tokens": sum(traj.loss_mask),
        "policy_turns": len(traj.policy_segments()),
        **{f"{k}_tokens": v for k, v in counts.items()},
    }


def print_trajectory(traj: Trajectory, console: Console | None = None) -> None:
    """Print the conversation with each segment styled by source, then a count table.

    Segment text is a viewer's convenience (decoded from the segment's own tokens); rich
    renders it as plain text, so model or tool output cannot inject markup.
    """
    console = console or Console()
    body = Text()
    for seg in traj.segments:
        body.append(seg.text or f"<{len(seg.token_ids)} tokens>", style=STYLE[seg.source])
    console.print(body)
    legend = Text("legend: ")
    for src, style in STYLE.items():
        legend.append(f"{src.value} ", style=style)
    console.print(legend)
    table = Table(title="tokens by author")
    table.add_column("source")
    table.add_column("tokens", justify="right")
    table.add_column("loss", justify="right")
    for src in Source:
        n = traj.count(src)
        table.add_row(src.value, str(n), str(n if src is Source.POLICY else 0))
    console.print(table)


def print_episode(ep: EpisodeRecord, console: Console | None = None) -> None:
    """What the episode's HTML page shows: facts, reward breakdown, steps, tokens."""
    console = console or Console()
    verdict = classify(ep)
    ids = [("episode", ep.episode_id), ("replay id", ep.receipt.get("replay_id"))]
    rows = [
        ("where", ep.where),
        ("question", ep.question),
        ("gold answers", ", ".join(ep.gold_answers)),  # none: no row (the HTML page's rule)
        ("stop reason", ep.stop_reason),
        ("attribution", ep.attribution),
        ("triage", f"{verdict.bucket} / {verdict.kind}: {verdict.why}"),
        ("reward", "-" if ep.total is None else f"{ep.total:.3f}"),
        ("agent", agent_text(ep.receipt)),
    ]
    ids = [(k, str(v)) for k, v in ids if v not in (None, "")]
    rows = [(k, str(v)) for k, v in rows if v not in (None, "")]
    width = max(len(k) for k, _ in ids + rows)
    for k, v in ids:  # whole, on one line, at any width: they are copied into commands
        print_line(console, k.ljust(width), v)
    facts = Table(show_header=False, box=None, pad_edge=False)
    facts.add_column(min_width=width)
    facts.add_column()
    for k, v in rows:
        facts.add_row(Text(k, style="bold"), Text(v))
    console.print(facts)
    if ep.reward is not None:
        rt = Table(title="reward breakdown")
        comps = ep.reward.components
        states = ["gated" if c.gated else "" if c.decided else "undecided" for c in comps]
        cols = ["component", "layer", "value", "weight", "contribution"]
        cols += ["state"] if any(states) else []  # room for the rest in a narrow terminal
        for col in cols:
            rt.add_column(  # a narrow terminal folds cells, never cuts a name short
                col,
                justify="right" if col in ("value", "weight", "contribution") else "left",
                overflow="fold",
            )
        for c, state in zip(comps, states, strict=True):
            rt.add_row(
                Text(c.name),
                c.layer.value,
                f"{c.value:.3f}",
                f"{c.weight:.2f}",
                f"{c.contribution:.3f}",
                *([state] if any(states) else []),
            )
        console.print(rt)
        for c in comps:  # what each verifier saw and decided on (the HTML page has it all)
            if c.evidence and not c.gated:
                console.print(Text(f"  {describe(c, pairs=6, width=60)}"), soft_wrap=True)
    st = Table(title="steps")
    for col in ("step", "action", "observation", "latency ms", "evidence gain"):
        st.add_column(col, overflow="fold")
    for s in ep.steps:
        st.add_row(
            str(s.get("step")),
            Text(action_text(s)),
            Text(observation_text(s)),
            f"{s.get('latency_ms') or 0.0:.1f}",
            f"{s.get('evidence_gain') or 0.0:.2f}",
        )
    console.print(st)
    for i, t in enumerate(ep.trajectories):
        if len(ep.trajectories) > 1:  # where each sample starts, and why
            why = sample_origin(ep.trajectories, i)
            console.print(Text(f"sample {t.sample_index} ({why})", style="bold"))
        print_trajectory(t, console)


def print_triage(
    tri: Triage, console: Console | None = None, run: str | os.PathLike[str] | None = None
) -> None:
    """One table per bucket (kinds, counts, shares), then example episodes of each kind:
    `tracerl show` commands (with `run`) or ids, each whole on its own line, so they can be
    copied at any terminal width."""
    console = console or Console()
    n = len(tri.verdicts)
    counts = tri.counts()
    console.print(
        Text(
            f"{n} episodes: " + ", ".join(f"{b} {counts.get(b, 0)}" for b in BUCKETS),
            style="bold",
        )
    )
    for bucket in BUCKETS:
        kinds = tri.kinds(bucket)
        if not kinds:
            continue
        table = Table(title=f"{bucket} ({counts[bucket]})")
        for col in ("kind", "episodes", "share"):
            table.add_column(col, justify="left" if col == "kind" else "right")
        ordered = sorted(kinds.items(), key=lambda kv: -kv[1])
        for kind, k in ordered:
            table.add_row(kind, str(k), f"{100 * k / max(1, n):.0f}%")
        console.print(table)
        prefix = f"tracerl show {shlex.quote(str(run))} " if run is not None else ""
        console.print(
            Text(f"examples ({prefix or 'tracerl show RUN '}<id>):", style="dim"), soft_wrap=True
        )
        width = max(len(kind) for kind in kinds)
        for kind, _ in ordered:
            for e, _ in tri.examples(bucket, kind, 2):
                print_line(console, f"  {kind.ljust(width)}", prefix + shlex.quote(e.episode_id))


def print_line(console: Console, label: str, value: str, sep: str = "  ") -> None:
    """`label  value` on one line that is never wrapped nor cut (the terminal may fold it
    on screen, but a copy gets it whole): for ids and commands meant to be copied."""
    console.print(Text.assemble((label, "bold"), sep, value), soft_wrap=True)


def _with_stderr(value: float | None, stderr: float | None) -> str:
    """``0.375 ± 0.171`` (the value alone where no standard error was recorded;
    ``undefined`` where there is no value: no episode decided)."""
    if value is None:
        return UNDEFINED
    return f"{value:.3f}" + ("" if stderr is None else f" ± {stderr:.3f}")


UNDEFINED = "undefined"
"""How a figure with nothing to average is printed (every episode undecided): never 0."""


def _num(value: float | None) -> str:
    return UNDEFINED if value is None else f"{value:.3f}"


def print_evals(run_dir: Path, console: Console) -> None:
    """The run's evaluations side by side, and the headline: baseline vs final."""
    history = eval_history(run_dir)
    if not history:
        return
    print_line(console, "evaluations of", str(run_dir), " ")  # a path: never wrapped
    table = Table()
    for col in ("stage", "after RL step", "split", "success", "mean reward"):
        table.add_column(col)
    for h in history:
        table.add_row(
            h["stage"],
            str(h["step"]),
            h["split"],
            _with_stderr(h["success_rate"], h.get("success_rate_stderr")),
            _num(h["reward_mean"]),
        )
    console.print(table)
    split = history[0]["split"]  # the eval split comes first in every evaluation
    history = [h for h in history if h["split"] == split]
    first, last = history[0], history[-1]
    line = f"{split} success: baseline {_num(first['success_rate'])}"
    warm = [h for h in history if h["stage"] == "warm_start"]
    if warm:
        line += f", after the warm start {_num(warm[-1]['success_rate'])}"
    if last["stage"] == "train":
        line += f", after {last['step']} GRPO steps {_num(last['success_rate'])}"
    if any(h["success_rate"] is None for h in history):
        line += f" ({UNDEFINED}: no episode's reward decided; `tracerl review {run_dir}`)"
    console.print(line, markup=False, soft_wrap=True)
