"""The `tracerl` command. Each command parses its arguments, then calls one function.

A user's mistake (a `tracerl.errors.UserError`: a bad config, an unknown name, a missing
file) is printed in one or two lines, without a traceback, with exit status 2, before any
model is loaded; ``tracerl --debug COMMAND ...`` (or ``TRACERL_DEBUG=1``) shows the traceback.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from typer.core import TyperGroup

import tracerl
from tracerl.errors import UserError
from tracerl.eval_cli import eval_command
from tracerl.gateway.cli import gateway_command
from tracerl.readiness.cli import readiness
from tracerl.rollout.serve import serve_command
from tracerl.scaffold import init_command

console = Console(emoji=False)  # ":smile:" in a task id or a name stays as written
err_console = Console(stderr=True, soft_wrap=True, emoji=False)
_debug = [os.environ.get("TRACERL_DEBUG", "") not in ("", "0")]


class _Commands(TyperGroup):
    """Every command's user errors become two lines and exit status 2 (tracebacks with
    ``--debug``)."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except UserError as e:
            if _debug[0]:
                raise
            raise _fail(e.message, e.hint) from None


app = typer.Typer(
    cls=_Commands,
    rich_markup_mode="markdown",  # a docstring paragraph reflows: no line cut mid-sentence
    help="tracerl: train tool-using LLM agents with RL, with rollouts you can trust.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def _options(
    debug: Annotated[
        bool, typer.Option("--debug", help="Show the traceback of any error.")
    ] = False,
) -> None:
    if debug:
        _debug[0] = True


def _fail(message: str, hint: str | None = None) -> typer.Exit:
    """Print an error for a person (no traceback, no markup) and return the exit to raise."""
    err_console.print(f"error: {message}", markup=False, highlight=False)
    if hint:
        err_console.print(f"  {hint}", markup=False, highlight=False)
    return typer.Exit(2)


def _config(config: Path | None, overrides: list[str] | None) -> Any:
    """A checked run config (`tracerl.preflight`) from a YAML file and dotted overrides (or
    overrides alone): environment, splits, reward and model spec resolved, nothing loaded."""
    from tracerl.config import ConfigError
    from tracerl.config_loading import load_config
    from tracerl.preflight import prepare

    if config is not None and "=" in str(config) and not config.exists():  # only overrides
        overrides, config = [str(config), *(overrides or [])], None
    cfg = load_config(config, overrides or [])
    try:
        prepared = prepare(cfg)
    except ConfigError as e:
        where = f"{config}: " if config is not None else ""
        raise ConfigError(where + e.message, e.hint) from e
    for warning in prepared.warnings:
        err_console.print(f"warning: {warning}", markup=False, highlight=False)
    return prepared


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


@app.command()
def show(
    path: Annotated[Path, typer.Argument(help="a run directory, or a .jsonl[.gz] file")],
    episode: Annotated[
        str | None, typer.Argument(help="with a run directory: an episode id or replay id")
    ] = None,
    index: Annotated[int, typer.Option(help="with a file: which trajectory in it")] = 0,
) -> None:
    """Show an episode of a run, or one trajectory of a file.

    An episode: its facts, reward breakdown, steps, and tokens coloured by author."""
    from tracerl.jsonl import read_trajectories
    from tracerl.report.terminal import print_episode, print_trajectory

    if path.is_dir():  # a RunDirError or TrajectoryError is a UserError: two lines, exit 2
        from tracerl.report.run import check_run_dir, find_episode

        if episode is None:
            raise _fail(
                f"{path} is a run directory: name an episode, e.g. `tracerl show {path} <id>` "
                f"(ids are listed by `tracerl triage {path}`)"
            )
        print_episode(find_episode(check_run_dir(path), episode), console)
        return
    try:
        trajs = read_trajectories(path)
    except FileNotFoundError as e:
        raise _fail(str(e)) from None
    if not 0 <= index < len(trajs):
        raise _fail(f"{path} holds {len(trajs)} trajectories; index {index} is out of range")
    print_trajectory(trajs[index], console)


@app.command()
def report(
    run: Annotated[Path, typer.Argument(help="a run directory (runs/NAME)")],
    n: Annotated[int, typer.Option("--n", help="training episodes to triage")] = 100,
) -> None:
    """Write the run's dashboard (RUN/report/index.html) and print its path.

    Self-contained and offline, with a page for each episode it links."""
    index = _write_report(run, n)
    console.print(f"report: {index}", markup=False, highlight=False, soft_wrap=True)


@app.command()
def triage(
    run: Annotated[Path, typer.Argument(help="a run directory (runs/NAME)")],
    n: Annotated[int, typer.Option("--n", help="how many of the last training episodes")] = 100,
) -> None:
    """Split the last N training episodes by outcome, owner and kind of failure.

    Buckets: succeeded, policy failures by kind, environment failures, evaluator failures
    or undecidable; each kind with example episode ids for `tracerl show RUN ID`."""
    from tracerl.report.run import check_run_dir, iter_episodes
    from tracerl.report.terminal import print_triage
    from tracerl.report.triage import triage as run_triage

    if n < 1:
        raise _fail(f"--n must be at least 1, got {n}")
    result = run_triage(list(iter_episodes(check_run_dir(run))), n)
    print_triage(result, console, run=run)


@app.command("check-env")
def check_env_cmd(
    name: Annotated[
        str | None,
        typer.Argument(help="an environment: a built-in or entry point name, or module:Class"),
    ] = None,
    arg: Annotated[
        list[str] | None,
        typer.Option(help="an argument for the environment, KEY=VALUE (repeatable)"),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            help="check the environment a run config trains: its env.name, env.kwargs and "
            "env.mcp servers"
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="seed for the determinism checks")] = 0,
) -> None:
    """Check an environment: versions, tool schemas, splits, determinism, dry runs, reward
    (and, for tools from MCP servers, each server's identity, listing and dry-run paths).

    Exit 0 when every check passes, 1 when one fails, 2 when the environment cannot be
    found or built."""
    from tracerl.config import ConfigError
    from tracerl.config_loading import apply_overrides, load_config
    from tracerl.envs import check_env
    from tracerl.envs.registry import env_factory
    from tracerl.models.loading import smollm2_tokenizer
    from tracerl.models.render import ChatRenderer
    from tracerl.preflight import build_probe

    kwargs = apply_overrides({}, list(arg or []))
    mcp: list = []
    if config is not None:
        env_cfg = load_config(config).env
        if name is not None and name != env_cfg.name:
            raise ConfigError(
                f"check-env: {name!r} and --config {config} (env.name {env_cfg.name!r}) "
                "name different environments",
                "give one of them",
            )
        name, kwargs, mcp = env_cfg.name, {**env_cfg.kwargs, **kwargs}, env_cfg.mcp
    if name is None:
        raise ConfigError("check-env: name an environment, or give --config FILE")
    try:  # a name that resolves to nothing, or an env that cannot be built: exit 2
        build_probe(name, kwargs, mcp)
    except ConfigError as e:
        message = e.message.removeprefix("env.name: ").replace("env.kwargs: ", "--arg: ", 1)
        raise ConfigError(message, e.hint) from e
    label = name + "".join(f" {a}" for a in arg or [])
    report = check_env(
        env_factory(name, kwargs, mcp),
        renderer=ChatRenderer(smollm2_tokenizer()),
        seed=seed,
        raise_on_failure=False,
        label=label,
    )
    console.print(str(report), markup=False, highlight=False)
    if not report.ok:
        raise typer.Exit(1)


@app.command()
def replay(
    run: Annotated[Path, typer.Argument(help="a run directory (or a name under runs/)")],
    episode: Annotated[str, typer.Option(help="episode id or replay id (ro_...)")],
    live: Annotated[
        bool, typer.Option(help="run the recorded actions against the live env; report drift")
    ] = False,
) -> None:
    """Replay a recorded episode, exactly or against the live environment (--live).

    Exit 0 if it reproduces exactly (with --live: nothing drifted); exit 1 with the first
    difference otherwise. A live replay rebuilds the environment from the receipt (its
    import path too), with writes as dry runs."""
    import asyncio

    from tracerl.report.run import check_run_dir, find_episode
    from tracerl.rollout.replay import replay_exact, replay_live

    if not run.exists() and (Path("runs") / run).exists():
        run = Path("runs") / run
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


@app.command()
def train(
    config: Annotated[Path | None, typer.Argument(help="a YAML config (configs/*.yaml)")] = None,
    overrides: Annotated[
        list[str] | None, typer.Argument(help="dotted overrides: trainer.lr=1e-5 ...")
    ] = None,
    resume: Annotated[
        bool, typer.Option(help="continue the run from its newest checkpoint")
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
    from tracerl.train.loop import train as run_training

    prepared = _config(config, overrides)
    cfg = prepared.cfg
    if print_config:
        sys.stdout.write(dump_config(cfg))  # raw: never wrapped, valid YAML when piped
        return
    from tracerl.report.progress import RichProgress
    from tracerl.train.distributed.group import follow, launch

    with launch(cfg) as here:  # under torchrun: rank 0 drives, the other ranks only learn
        if not here.ranks.main:
            follow(cfg, log=lambda line: err_console.print(line, markup=False))
            return
        with RichProgress(console) as bars:
            run_training(cfg, resume=resume, progress=bars, prepared=prepared)
    from tracerl.report.terminal import print_evals

    print_evals(cfg.run_dir, console)
    console.print(
        f"report: {_write_report(cfg.run_dir)}", markup=False, highlight=False, soft_wrap=True
    )


def _write_report(run: Path, n: int = 100) -> Path:
    """The dashboard, with the judges' agreement with people refreshed first when the run
    has a review pool (a resumed run's pool holds verdicts on earlier steps' answers)."""
    from tracerl.judge_calibration import REVIEW_FILE, judged_in_run, write_agreement
    from tracerl.report.html import write_report
    from tracerl.report.run import RunData

    data = RunData.load(run)  # read once, for both
    if (run / REVIEW_FILE).exists():
        write_agreement(run, judged_in_run(data.episodes))
    return write_report(run, n_triage=n, data=data)


@app.command()
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
    from tracerl.models import load
    from tracerl.models.loading import check_spec
    from tracerl.train.sft import sft as run_sft
    from tracerl.train.sft import sft_data

    check_spec(model)
    if lr <= 0 or epochs < 1:
        raise _fail(f"--lr must be above 0 and --epochs at least 1, got {lr} and {epochs}")
    if out.exists() and not out.is_dir():
        raise _fail(f"--out {out} is a file", "give a folder to save the model in")
    try:
        trajectories = sft_data(data, successful_only=not all_episodes)
    except FileNotFoundError as e:
        raise _fail(str(e), "pass a run directory or a .jsonl(.gz) of trajectories") from e
    except UnicodeDecodeError:
        raise _fail(f"{data}: not a text file of trajectories (.jsonl or .jsonl.gz)") from None
    except ValueError as e:
        raise _fail(str(e)) from e
    if not trajectories:
        raise _fail(
            f"{data}: no {'' if all_episodes else 'successful '}trajectories to learn from",
            "imitate every episode with --all, or give a run that has successes",
        )
    bundle = load(model)
    from tracerl.report.progress import RichProgress

    with RichProgress(console) as bars:
        result = run_sft(bundle.model, trajectories, lr=lr, epochs=epochs, progress=bars)
    bundle.model.save_pretrained(out)
    bundle.tokenizer.save_pretrained(out)
    console.print(
        f"{len(trajectories)} trajectories, NLL {result.nll_before:.3f} before -> "
        f"{result.nll_after:.3f} after; "
        f"saved to {out} (load it as hf:{out})",
        markup=False,
    )


@app.command()
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
        raise _fail(
            f"{run}: no review.sqlite",
            "the review pool is kept by `tracerl eval --out DIR` on the search questions "
            "(without a CONFIG), or filled from a judge's verdicts with --from-judge N",
        )
    pool = ReviewPool(path)
    if decide is not None:
        if correct is None or not reviewer:
            raise _fail("--decide needs --correct or --wrong, and --reviewer NAME")
        try:
            s = pool.decide(decide, correct, reviewer)
        except KeyError as e:
            raise _fail(str(e.args[0])) from None
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
        raise _fail(f"--from-judge {n}: give a positive number of answers to queue")
    try:
        added, judged = queue_judged(run, n)
    except RunDirError as e:
        raise _fail(str(e)) from None
    if not judged:
        raise _fail(
            f"{run}: no episode has a judge's verdict",
            "score with a judge (a reward component with fn: judge, docs/judges.md)",
        )
    console.print(
        f"queued {len(added)} of {judged} judged answers for review "
        f"({sum(j.other is not None and j.other != j.says_correct for j in added)} where the "
        "judge and another verifier disagree)",
        markup=False,
    )


@app.command("serve-retriever")
def serve_retriever(
    corpus: Annotated[str, typer.Option(help="wiki, synthetic or jsonl:PATH")] = "wiki",
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 8000,
) -> None:
    """Serve BM25 retrieval over a corpus with Search-R1's protocol (POST /retrieve)."""
    from tracerl.envs.search.corpus import load_corpus
    from tracerl.envs.search.server import RetrievalServer

    try:
        docs = load_corpus(corpus)
    except (KeyError, FileNotFoundError, ValueError) as e:
        raise _fail(str(e.args[0] if e.args else e)) from None
    server = RetrievalServer(docs, host, port)
    console.print(f"serving {len(docs)} documents of {corpus} at {server.url}/retrieve")
    server.serve_forever()


app.command()(readiness)
app.command("eval")(eval_command)
app.command("serve")(serve_command)
app.command("gateway")(gateway_command)
app.command("init")(init_command)

if __name__ == "__main__":
    app()
