"""`tracerl readiness`: should this task get RL at all? (`tracerl.readiness.run`)"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tracerl.cli.common import console, prepare_config


def readiness(
    config: Annotated[Path | None, typer.Argument(help="a YAML config (configs/*.yaml)")] = None,
    overrides: Annotated[
        list[str] | None, typer.Argument(help="dotted overrides: env.tasks_per_step=8 ...")
    ] = None,
    episodes: Annotated[
        int | None,
        typer.Option(
            help="episodes to sample (default: one step, tasks_per_step x group_size)", min=1
        ),
    ] = None,
    sft: Annotated[
        str | None, typer.Option(help="an SFT checkpoint (hf:DIR) to compare on the same tasks")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the JSON report only")] = False,
) -> None:
    """Should this task get RL at all? Four measured answers and one recommendation."""
    from tracerl.readiness.run import print_readiness, readiness_from_config

    cfg = prepare_config(config, overrides, workers=False).cfg  # samples in process
    if sft is not None:
        from tracerl.models.specs import check_spec

        check_spec(sft)
    result = readiness_from_config(cfg, episodes=episodes, compare=sft)
    print_readiness(result, console, as_json=as_json)
