"""A terminal view of a trajectory: every token coloured by its author."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

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
