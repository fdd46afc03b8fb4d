"""`tracerl train` (GRPO, synchronous or asynchronous, across processes under torchrun),
`tracerl sft` (supervised fine-tuning on trajectories) and `tracerl export` (a run's
checkpoint as a Hugging Face folder)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from tracerl.cli.common import (
    configs_here,
    console,
    err_console,
    fail,
    prepare_config,
    progress_bars,
    run_folder,
    write_report,
)


def train(
    config: Annotated[Path | None, typer.Argument(help="a YAML config (configs/*.yaml)")] = None,
    overrides: Annotated[
        list[str] | None, typer.Argument(help="dotted overrides: trainer.lr=1e-5 ...")
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(
            help="continue the run from its newest checkpoint (CONFIG: its config, or the "
            "run's folder)"
        ),
    ] = False,
    print_config: Annotated[
        bool,
        typer.Option(
            "--print-config", help="print the resolved config (defaults filled in) and exit"
        ),
    ] = False,
) -> None:
    """Train with GRPO, synchronous or asynchronous (trainer.mode: async).

    Writes the run directory runs/NAME: episodes, metrics, checkpoints, and the dashboard.
    Across processes: `torchrun --nproc-per-node N -m tracerl train CONFIG
    trainer.learner.strategy=ddp` (or fsdp2); rank 0 writes the run.
    The config is checked first (environment, splits, reward, model spec): a mistake stops
    the command before any model loads or anything is written."""
    from tracerl.config import dump_config

    if config is None and not overrides:  # nothing said what to train: never a default run
        _usage()
    config, overrides = _run_as_config(config, overrides, resume)
    prepared = prepare_config(config, overrides)  # before torch loads: a mistake in a second
    cfg = prepared.cfg
    if print_config:
        sys.stdout.write(dump_config(cfg))  # raw: never wrapped, valid YAML when piped
        return
    if os.environ.get("RANK", "0") == "0":  # torchrun's other ranks: rank 0 writes the run
        from tracerl.train.resume import check_start

        check_start(cfg.run_dir, cfg.model_dump(mode="json"), resume)  # before torch loads
    from tracerl.train.distributed import group
    from tracerl.train.loop import train as run_training
    from tracerl.train.run import Run

    run = Run(prepared)  # what every rank builds, the same way
    with group.launch(cfg) as here:  # under torchrun: rank 0 drives, the others only learn
        if not here.ranks.main:
            group.follow(run, log=lambda line: err_console.print(line, markup=False))
            return
        with progress_bars() as bars:
            run_training(cfg, resume=resume, progress=bars, run=run)
    from tracerl.report.run import RunDirError, check_run_dir
    from tracerl.report.terminal import print_evals

    run_dir = cfg.run_dir
    try:
        check_run_dir(run_dir)
    except RunDirError:  # stopped (Ctrl-C) before anything was recorded: nothing wrong
        console.print(f"no report: {run_dir} has no metrics or episodes yet", markup=False)
        return
    print_evals(run_dir, console)
    console.print(f"report: {write_report(run_dir)}", markup=False, highlight=False, soft_wrap=True)


def _run_as_config(
    config: Path | None, overrides: list[str] | None, resume: bool
) -> tuple[Path | None, list[str] | None]:
    """`tracerl train --resume RUN`: a run's folder (or its name under runs/) stands for the
    config it was started with, and the run goes on where the folder is now (moved or
    copied runs included). Without --resume, a run's folder is refused: a new run never
    goes where one is."""
    if config is None or config.is_file():
        return config, overrides
    folder = run_folder(config)
    saved = folder / "config.yaml"
    if not (folder.is_dir() and saved.is_file()):
        return config, overrides  # not a run: the config loader says what it is
    if not resume:
        raise fail(
            f"{folder}: a run's folder, not a config file",
            f"continue that run: tracerl train --resume {folder}; or start a new one from "
            f"its config: tracerl train {saved} name=NEW",
        )
    here = [f"out_dir={json.dumps(str(folder.resolve().parent))}", f"name={folder.name}"]
    return saved, [*here, *(overrides or [])]


def _usage() -> None:
    """Usage and the configs found here, on stderr; exit 2."""
    found = configs_here()
    lines = [
        "usage: tracerl train CONFIG [key=value ...] [--resume] [--print-config]",
        "       tracerl train --resume RUN [key=value ...]",
    ]
    if found:
        lines += ["configs here:", *(f"  {p}" for p in found)]
    lines.append("e.g. tracerl train configs/demo.yaml trainer.steps=2 (docs/config.md)")
    err_console.print("\n".join(lines), markup=False, highlight=False)
    raise typer.Exit(2)


FROM = "pass a run directory or a .jsonl(.gz) of trajectories"


def sft(
    data: Annotated[Path, typer.Argument(help="a run directory or a trajectories .jsonl(.gz)")],
    out: Annotated[Path, typer.Option(help="folder to save the tuned model (load it as hf:OUT)")],
    model: Annotated[str, typer.Option(help="model spec to start from")] = "smollm2-135m-instruct",
    epochs: Annotated[int, typer.Option(help="passes over the data")] = 1,
    lr: Annotated[float, typer.Option(help="AdamW learning rate")] = 1e-5,
    all_episodes: Annotated[
        bool, typer.Option("--all", help="imitate every episode, not only successful ones")
    ] = False,
) -> None:
    """Supervised fine-tuning on trajectories, with loss on policy tokens only.

    The masks are RL's: tool output, prompts and template tokens never carry loss."""
    from tracerl.models.specs import check_spec

    check_spec(model)
    if lr <= 0 or epochs < 1:
        raise fail(f"--lr must be above 0 and --epochs at least 1, got {lr} and {epochs}")
    if out.exists() and not out.is_dir():
        raise fail(f"--out {out} is a file", "give a folder to save the model in")
    if not data.exists():
        raise fail(f"{data}: no such file or folder", FROM)
    from tracerl.models import load  # the model stack: once what it is given is checked
    from tracerl.train.sft import check_fit, sft_data
    from tracerl.train.sft import sft as run_sft

    try:
        trajectories = sft_data(data, successful_only=not all_episodes)
    except FileNotFoundError as e:
        raise fail(str(e), FROM) from e
    except UnicodeDecodeError:
        raise fail(f"{data}: not a text file of trajectories (.jsonl or .jsonl.gz)") from None
    except ValueError as e:
        raise fail(str(e)) from e
    if not trajectories:
        raise fail(
            f"{data}: no {'' if all_episodes else 'successful '}trajectories to learn from",
            "imitate every episode with --all, or give a run that has successes",
        )
    # token ids mean something to one tokenizer: refused before the weights load
    for warning in check_fit(trajectories, model, data):
        err_console.print(f"warning: {warning}", markup=False, highlight=False, soft_wrap=True)
    bundle = load(model)

    with progress_bars() as bars:
        result = run_sft(bundle.model, trajectories, lr=lr, epochs=epochs, progress=bars)
    bundle.model.save_pretrained(out)
    bundle.tokenizer.save_pretrained(out)
    console.print(
        f"{len(trajectories)} trajectories, NLL {result.nll_before:.3f} before -> "
        f"{result.nll_after:.3f} after; "
        f"saved to {out} (load it as hf:{out})",
        markup=False,
    )


def export(
    run: Annotated[Path, typer.Argument(help="a run directory (or a name under runs/)")],
    out: Annotated[Path, typer.Option(help="the folder to write (load it as hf:OUT)")],
    step: Annotated[
        int | None, typer.Option(help="the checkpoint after this step (default: the newest)")
    ] = None,
) -> None:
    """Export a run's trained policy as a Hugging Face folder that serves as it trained.

    Weights (LoRA merged), tokenizer, a chat template rendering `tools=` as the run's
    prompts did, generation_config.json (stop tokens, sampling), a model card (README.md)
    and, for SmolLM2's call format, a vLLM tool-parser plugin.

    `model.spec: hf:OUT`, vLLM and transformers load it; tracerl_export.json says which
    run, step, policy version and tool-call parser it is. An existing folder is never
    overwritten."""
    from tracerl.train.export import export_run

    run = run_folder(run)
    receipt = export_run(run, out, step)
    console.print(
        f"exported {run} after step {receipt['step']} (policy version "
        f"{receipt['policy_version']}, base {receipt['base_model']}"
        f"{', LoRA merged' if receipt['lora_merged'] else ''}) to {out}; "
        f"load it as hf:{out}; how to serve it with its tools: {out / 'README.md'}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
