"""The `tracerl` command. Each command parses its arguments, then calls one function."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

import tracerl

app = typer.Typer(
    help="tracerl: train tool-using LLM agents with RL, with rollouts you can trust.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()
err_console = Console(stderr=True, soft_wrap=True)


def _fail(message: str) -> typer.Exit:
    """Print an error for a person (no traceback, no markup) and return the exit to raise."""
    err_console.print(f"error: {message}", markup=False, highlight=False)
    return typer.Exit(2)


@app.command()
def version() -> None:
    """Print the tracerl version."""
    console.print(tracerl.__version__)


@app.command()
def demo(
    out: Annotated[Path, typer.Option(help="run directory to write")] = Path("runs/demo"),
) -> None:
    """Run the end-to-end demo on SmolLM2-135M-Instruct and write its episodes."""
    from tracerl.demo import main

    main(str(out), console)


@app.command("load-model")
def load_model(
    spec: Annotated[str, typer.Argument(help="smollm2-135m-instruct, tiny-random or hf:<folder>")],
) -> None:
    """Load a model spec and report where it came from and how long it took."""
    from tracerl.models import ModelNotFoundError, load

    try:
        bundle = load(spec)
    except ModelNotFoundError as e:
        raise _fail(str(e)) from None
    params = sum(p.numel() for p in bundle.model.parameters())
    console.print(
        f"{bundle.model_id}: {params / 1e6:.1f}M parameters, origin={bundle.origin}, "
        f"loaded in {bundle.load_seconds:.2f} s, template sha256 "
        f"{bundle.renderer.template_hash[:12]}"
    )


@app.command()
def show(
    path: Annotated[Path, typer.Argument(help="a trajectories .jsonl or .jsonl.gz file")],
    index: Annotated[int, typer.Option(help="which trajectory in the file")] = 0,
) -> None:
    """Show one trajectory with every token coloured by its author."""
    from tracerl.jsonl import read_trajectories
    from tracerl.report.terminal import print_trajectory
    from tracerl.types import TrajectoryError

    try:
        trajs = read_trajectories(path)
    except (FileNotFoundError, TrajectoryError) as e:
        raise _fail(str(e)) from None
    if not 0 <= index < len(trajs):
        raise _fail(f"{path} holds {len(trajs)} trajectories; index {index} is out of range")
    print_trajectory(trajs[index], console)


if __name__ == "__main__":
    app()
