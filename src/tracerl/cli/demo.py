"""`tracerl version`, `tracerl demo`, `tracerl load-model`: what is installed, and a first run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

import tracerl
from tracerl.cli.common import console


def version() -> None:
    """Print the tracerl version."""
    console.print(tracerl.__version__)


def demo(
    out: Annotated[Path, typer.Option(help="run directory to write")] = Path("runs/demo"),
) -> None:
    """Run the end-to-end demo on SmolLM2-135M-Instruct and write its episodes."""
    from tracerl.demo import main

    main(str(out), console)


def load_model(
    spec: Annotated[str, typer.Argument(help="smollm2-135m-instruct, tiny-random or hf:FOLDER")],
) -> None:
    """Load a model spec and report where it came from and how long it took."""
    from tracerl.models import load

    bundle = load(spec)
    params = sum(p.numel() for p in bundle.model.parameters())
    console.print(
        f"{bundle.model_id}: {params / 1e6:.1f}M parameters, origin={bundle.origin}, "
        f"loaded in {bundle.load_seconds:.2f} s, template sha256 "
        f"{bundle.renderer.template_hash[:12]}"
    )
