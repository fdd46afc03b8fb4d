"""`tracerl eval`: a config's model on its environment
(`tracerl.train.evaluation.evaluate_config`), or a model on the held-out search questions
(`tracerl.evaluate`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tracerl.cli.common import console, fail, prepare_config, progress_bars


def eval_command(
    config: Annotated[
        Path | None, typer.Argument(help="a YAML config: evaluate its model on its environment")
    ] = None,
    overrides: Annotated[
        list[str] | None, typer.Argument(help="dotted overrides: env.eval_tasks=50 ...")
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="without CONFIG: the model spec (smollm2-135m-instruct)")
    ] = None,
    corpus: Annotated[
        str | None, typer.Option(help="without CONFIG: synthetic or wiki (synthetic)")
    ] = None,
    protocol: Annotated[
        str | None, typer.Option(help="without CONFIG: tools or search_r1 (tools)")
    ] = None,
    split: Annotated[
        list[str] | None, typer.Option(help="without CONFIG: splits to evaluate (heldout)")
    ] = None,
    n: Annotated[
        int | None, typer.Option(help="tasks per split (default: 20, or the config's)", min=1)
    ] = None,
    out: Annotated[Path, typer.Option(help="run directory to write")] = Path("runs/eval"),
    seed: Annotated[int, typer.Option(help="task sample and sampling seed")] = 0,
    temperature: Annotated[
        float | None,
        typer.Option(
            help="sampling temperature, 0: greedy (default: 0.7, or the config's "
            "eval.temperature; with CONFIG it sets eval.temperature)",
            min=0.0,
        ),
    ] = None,
) -> None:
    """Evaluate a model on held-out tasks; write episodes and per-split metrics.

    With CONFIG: its model on its environment's eval split (and adversarial split, if set),
    scored by its reward, into --out (a run directory `show`, `triage` and `report` read).
    Without: a model on held-out search questions (--corpus, --protocol, --split)."""
    from tracerl.train.resume import refuse_existing_run

    refuse_existing_run(out, "pick another --out")  # before any progress is drawn
    if config is not None or overrides:
        from tracerl.train.evaluation import evaluate_config

        given = [f"--{k}" for k, v in (("model", model), ("corpus", corpus)) if v is not None]
        given += ["--protocol"] * (protocol is not None) + ["--split"] * bool(split)
        if given:
            raise fail(
                f"{', '.join(given)} apply only without a CONFIG",
                "set them in the config instead (model.spec=..., env.kwargs.corpus=..., "
                "env.eval_split=...)",
            )
        given = [*(overrides or []), f"trainer.seed={seed}"]
        if temperature is not None:
            given.append(f"eval.temperature={temperature}")
        prepared = prepare_config(config, given, workers=False)  # samples in process
        with progress_bars() as bars:
            metrics = evaluate_config(prepared, out, n=n, progress=bars)
        written = out / "eval"
    else:
        from tracerl.envs import get_parser
        from tracerl.evaluate import check_search_eval, evaluate
        from tracerl.models import load
        from tracerl.models.placement import for_inference
        from tracerl.models.specs import check_spec

        model, corpus = model or "smollm2-135m-instruct", corpus or "synthetic"
        protocol = protocol or "tools"
        check_spec(model)
        check_search_eval(corpus, protocol, split or [])
        written = out
        from tracerl.rollout import BatchedHFSampler
        from tracerl.rollout.runner import Policy

        bundle = load(model)
        bundle.model = for_inference(bundle.model)
        t = 0.7 if temperature is None else temperature
        sampler = BatchedHFSampler(bundle.model, temperature=t, seed=seed)
        parser = get_parser("search_r1") if protocol == "search_r1" else None
        policy = Policy.from_bundle(bundle, sampler, parser)
        with progress_bars() as bars:
            metrics = evaluate(
                policy,
                corpus=corpus,
                protocol=protocol,
                splits=tuple(split or ["heldout"]),
                n=n or 20,
                out_dir=out,
                seed=seed,
                progress=bars,
            )
    for key, value in sorted(metrics.items()):
        if key.endswith("_stderr"):  # beside its metric: 0.375 ± 0.171
            continue
        if value or "success" in key or "@" in key:
            se = metrics.get(f"{key}_stderr")
            spread = "" if se is None else f" ± {se:.3f}"
            console.print(f"{key:55s} {value:8.3f}{spread}", markup=False)
    console.print(f"wrote {out}/metrics.jsonl and {written}/episodes/", markup=False)
