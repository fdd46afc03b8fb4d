"""What the commands share: the consoles, the ``--debug`` flag (`tracebacks`), the command
group that turns a `tracerl.errors.UserError` into two lines and exit status 2, `fail`, the
run config a command is given (`prepare_config`), the progress bars (`progress_bars`) and
the run's dashboard (`write_report`).

Command modules import this and lower layers only, never each other.
"""

from __future__ import annotations

import atexit
import gc
import inspect
import os
import types
import typing
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from typer.core import TyperGroup

from tracerl.errors import UserError

console = Console(emoji=False)  # ":smile:" in a task id or a name stays as written
err_console = Console(stderr=True, soft_wrap=True, emoji=False)
tracebacks = [os.environ.get("TRACERL_DEBUG", "") not in ("", "0")]
"""Whether errors show their traceback (``--debug`` or ``TRACERL_DEBUG=1``); a list so that
the flag can be set in place."""


class Commands(TyperGroup):
    """Every command's user errors become two lines and exit status 2 (tracebacks with
    ``--debug``)."""

    def get_command(self, ctx: Any, name: str) -> Any:
        command = super().get_command(ctx, name)
        if command is not None:
            _plain_types(command, ctx)
        return command

    def format_help(self, ctx: Any, formatter: Any) -> None:
        _plain_types(self, ctx)
        super().format_help(ctx, formatter)

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except UserError as e:
            if tracebacks[0]:
                raise
            raise fail(e.message, e.hint) from None


def _plain_types(command: Any, ctx: Any) -> None:
    """Help without a ``<type>`` on every parameter: none for flags (``--resume``,
    ``--help``) and arguments (their name says it), the usual upper-case name for option
    values (``--out PATH``, ``--port INT``).

    Nothing of typer's is read, only click's public parameter API (``get_params``,
    ``param_type_name``, ``is_flag``, ``name``, ``metavar``, ``callback``): typer's own type
    display differs between its releases (typer 0.12 has none). A value's type comes from the
    command function's annotations, which typer keeps on the callback it builds."""
    value_types = _annotations(command.callback)
    for p in command.get_params(ctx):
        if p.param_type_name == "argument":
            _hide_argument_type(p)
        elif p.param_type_name != "option" or p.metavar is not None:
            continue
        elif p.is_flag:
            p.metavar = ""
        elif p.name in value_types:
            p.metavar = _metavar(value_types[p.name])


def _hide_argument_type(argument: Any) -> None:
    """No type column for an argument. typer 0.29 prints one (``<str>``) from the hook set
    here and offers no public way to leave it out; a release without the hook shows what it
    shows, and nothing fails. The one name of typer's that the CLI uses, and only to set it
    (`tests/unit/test_cli_public_api.py` holds it to that)."""
    if hasattr(type(argument), "display_type_rich"):
        argument.display_type_rich = lambda ctx: None


def _annotations(function: Any) -> dict[str, Any]:
    """A command function's parameter types; none for a function that has no annotations we
    can resolve (help then shows typer's own names)."""
    if function is None:
        return {}
    try:
        return typing.get_type_hints(inspect.unwrap(function))
    except (NameError, TypeError):  # an annotation naming a type imported for checkers only
        return {}


_METAVARS = {str: "TEXT", int: "INT", float: "FLOAT", Path: "PATH", bool: "BOOLEAN"}


def _metavar(annotation: Any) -> str:
    """``str`` → TEXT, ``int | None`` → INT, ``list[str]`` → LIST[TEXT], ``Path`` → PATH;
    any other class, its name in upper case."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return "|".join(_metavar(a) for a in args)
    if typing.get_origin(annotation) is list:
        return f"LIST[{_metavar(args[0])}]" if args else "LIST"
    if annotation in _METAVARS:
        return _METAVARS[annotation]
    return getattr(annotation, "__name__", str(annotation)).upper()


def _print_version(wanted: bool) -> None:
    if wanted:
        import tracerl

        console.print(tracerl.__version__, markup=False, highlight=False)
        raise typer.Exit()


def _collect_once_then_freeze() -> None:
    """At exit: collect what is garbage now (its finalizers run, as they would have), then
    freeze the heap, so that the interpreter's own collections while it shuts down skip the
    millions of objects torch and transformers leave behind: 1-2 s less at the end of every
    command that loaded a model (`benchmarks/cli_exit.py`: 1.2-2.4 s -> 0.4-0.7 s after
    ``tracerl load-model tiny-random`` on 2 CPU cores).
    What must happen at exit is done explicitly (context managers, `atexit`), never left to
    a finalizer during shutdown, which Python does not promise to run."""
    gc.collect()
    gc.freeze()


_exit_hook: list[bool] = []


def options(
    debug: Annotated[
        bool, typer.Option("--debug", help="Show the traceback of any error.")
    ] = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    # the options every command takes, before its name: ``tracerl --debug COMMAND``
    # (no docstring: a callback's docstring would become the app's help)
    if debug:
        tracebacks[0] = True
    if not _exit_hook:  # once per process (a test's CliRunner calls this again and again)
        atexit.register(_collect_once_then_freeze)
        _exit_hook.append(True)


def configs_here() -> list[Path]:
    """The run configs in the working directory's ``configs/`` and ``examples/``."""
    return sorted(p for d in ("configs", "examples") for p in Path(d).glob("*.yaml"))


def run_folder(run: Path) -> Path:
    """A run directory as given, or a name under ``runs/``."""
    return Path("runs") / run if not run.exists() and (Path("runs") / run).exists() else run


def port_free(host: str, port: int, option: str = "--port") -> None:
    """`UserError` (two lines, exit 2) when `host:port` cannot be listened on — checked
    before a model loads, so a port in use costs a second, not a model load and a server's
    traceback. Bound as the servers bind (``SO_REUSEADDR``: a port whose last connections
    are still closing is free to them); port 0 (any free port) always is. A port outside
    0..65535 is refused: the socket layer would take it modulo 65536, or raise. The probe
    is `tracerl.gateway.ports.check_port`, which a run's preflight asks of ``agent.port``."""
    from tracerl.gateway.ports import check_port

    check_port(host, port, option)


def fail(message: str, hint: str | None = None) -> typer.Exit:
    """Print an error for a person (no traceback, no markup) and return the exit to raise."""
    err_console.print(f"error: {message}", markup=False, highlight=False)
    if hint:
        err_console.print(f"  {hint}", markup=False, highlight=False)
    return typer.Exit(2)


def prepare_config(
    config: Path | None, overrides: list[str] | None, *, workers: bool = True
) -> Any:
    """A checked run config (`tracerl.preflight`) from a YAML file and dotted overrides (or
    overrides alone): environment, splits, reward and model spec resolved, nothing loaded.
    `workers`: the command uses the run's Ray rollout workers (training does; an evaluation
    samples in process), so their cluster and sampling server must answer."""
    from tracerl.config import ConfigError
    from tracerl.config.loading import load_config
    from tracerl.preflight import prepare

    if config is not None and "=" in str(config) and not config.exists():  # only overrides
        overrides, config = [str(config), *(overrides or [])], None
    cfg = load_config(config, overrides or [])
    try:
        prepared = prepare(cfg, workers=workers)
    except ConfigError as e:
        where = f"{config}: " if config is not None else ""
        raise ConfigError(where + e.message, e.hint) from e
    for warning in prepared.warnings:
        err_console.print(f"warning: {warning}", markup=False, highlight=False)
    return prepared


def progress_bars() -> Any:
    """The console's progress bars (`tracerl.report.progress.RichProgress`), each phase's
    bar showing the turns and tokens sampled since it began."""
    from tracerl.report.progress import RichProgress
    from tracerl.rollout.activity import ACTIVITY

    return RichProgress(console, sampled=ACTIVITY.totals)


def write_report(run: Path, n: int = 100) -> Path:
    """The dashboard, with the judges' agreement with people refreshed first when the run
    has a review pool (a resumed run's pool holds verdicts on earlier steps' answers)."""
    from tracerl.judge_calibration import REVIEW_FILE, judged_in_run, write_agreement
    from tracerl.report.html import write_report as write_html
    from tracerl.report.run import RunData

    data = RunData.load(run)  # read once, for both
    if (run / REVIEW_FILE).exists():
        write_agreement(run, judged_in_run(data.episodes))
    return write_html(run, n_triage=n, data=data)
