"""`tracerl list` (what `env.name` and `model.spec` accept), `tracerl check-env` (an
environment against the contract), `tracerl serve-retriever` (the search environment's
retrieval as a server) and `tracerl init` (a starter package for your own environment,
written by `tracerl.scaffold`)."""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from tracerl.cli.common import configs_here, console, fail, port_free


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
            help="check the environment a run config trains: its env.name, env.kwargs, "
            "env.mcp servers and env.side_effect_guard / env.allow_real_writes"
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="seed for the determinism checks")] = 0,
) -> None:
    """Check an environment: versions, tool schemas, splits, determinism, dry runs, reward
    (and, for tools from MCP servers, each server's identity, listing and dry-run paths).

    Exit 0 when every check passes, 1 when one fails, 2 when the environment cannot be
    found or built."""
    from tracerl.config import ConfigError
    from tracerl.config.loading import apply_overrides, load_config
    from tracerl.preflight import build_probe

    kwargs = apply_overrides({}, list(arg or []))
    mcp: list = []
    real_writes = False
    if config is not None:  # the environment exactly as the config trains it
        env_cfg = load_config(config).env
        if name is not None and name != env_cfg.name:
            raise ConfigError(
                f"check-env: {name!r} and --config {config} (env.name {env_cfg.name!r}) "
                "name different environments",
                "give one of them",
            )
        name, kwargs, mcp = env_cfg.name, {**env_cfg.env_kwargs(), **kwargs}, env_cfg.mcp
        real_writes = env_cfg.allow_real_writes
    if name is None:
        raise ConfigError("check-env: name an environment, or give --config FILE")
    label = name + "".join(f" {a}" for a in arg or [])

    def say(line: str) -> None:  # each line as soon as it is known
        console.print(line, markup=False, highlight=False)

    say(f"check-env {label}: building the environment (its data, index or servers) ...")
    try:  # a name that resolves to nothing, or an env that cannot be built: exit 2
        _, probe = build_probe(name, kwargs, mcp)
    except ConfigError as e:
        message = e.message.removeprefix("env.name: ").replace("env.kwargs: ", "--arg: ", 1)
        raise ConfigError(message, e.hint) from e
    guard = getattr(probe, "side_effect_guard", "dry_run")
    if guard == "off":  # say plainly what its writes do here
        which = "every task" if real_writes else "tasks that set allow_real_writes"
        say(
            f"  side_effect_guard {guard!r}: writes run for real on {which}, as in training "
            "(the dry-run check runs on a copy with the guard on)"
        )
    from tracerl.envs.registry import env_factory  # the model stack: once the env is known
    from tracerl.models.loading import smollm2_tokenizer
    from tracerl.models.render import ChatRenderer
    from tracerl.rollout.env_check import check_env

    say("  loading the tokenizer its scripted episodes are rendered with ...")
    renderer = ChatRenderer(smollm2_tokenizer())
    say("  checks: versions, schemas, splits, determinism, dry runs, reward")
    report = check_env(
        env_factory(name, kwargs, mcp, real_writes=real_writes),
        renderer=renderer,
        seed=seed,
        raise_on_failure=False,
        label=label,
        on_result=say,
    )
    say(f"check_env({label}): {'ok' if report.ok else 'FAILED'}")
    if not report.ok:
        raise typer.Exit(1)


def list_command() -> None:
    """List the environments (`env.name`), model specs (`model.spec`) and configs here."""
    from tracerl.envs.registry import registered, resolve
    from tracerl.models.loading import MODEL_SPECS

    console.print("environments (env.name; also any package.module:Class):", markup=False)
    for name in registered():
        try:
            spec = resolve(name)
            doc, where = _summary(spec.factory), spec.import_path or ""
        except Exception as e:  # an entry point that cannot be loaded: say so, go on
            doc, where = f"cannot be loaded: {type(e).__name__}: {e}", ""
        console.print(f"  {name:<14} {doc or where}", markup=False, highlight=False)
    console.print("model specs (model.spec):", markup=False)
    for name in [*MODEL_SPECS, "hf:DIR"]:
        console.print(f"  {name}", markup=False, highlight=False)
    found = configs_here()
    if found:
        console.print("configs here (tracerl train CONFIG):", markup=False)
        for p in found:
            console.print(f"  {p}", markup=False, highlight=False)


def _summary(factory: Any) -> str:
    """The first sentence of what a factory (or its module) says it makes."""
    module = inspect.getmodule(factory)
    if inspect.isclass(factory):  # its module says what it is (`name`: ...)
        text = module.__doc__ if module is not None else factory.__doc__
    else:
        text = factory.__doc__
    first = inspect.cleandoc(text or "").split("\n\n")[0].replace("\n", " ")
    return first.split(". ")[0].rstrip(".") + "." if first else ""


def serve_retriever(
    corpus: Annotated[str, typer.Option(help="wiki, synthetic or jsonl:PATH")] = "wiki",
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on", min=0, max=65535)] = 8002,
) -> None:
    """Serve BM25 retrieval over a corpus with Search-R1's protocol (POST /retrieve)."""
    from tracerl.envs.search.corpus import load_corpus
    from tracerl.envs.search.server import RetrievalServer

    port_free(host, port)  # before the corpus loads and its index is built
    try:
        docs = load_corpus(corpus)
    except (KeyError, FileNotFoundError, ValueError) as e:
        raise fail(str(e.args[0] if e.args else e)) from None
    try:  # taken since port_free looked: the same two lines
        server = RetrievalServer(docs, host, port)
    except OSError as e:
        from tracerl.gateway.ports import port_error

        raise port_error(host, port, e) from None
    console.print(f"serving {len(docs)} documents of {corpus} at {server.url}/retrieve")
    server.serve_forever()


def init_command(
    name: Annotated[str, typer.Argument(help="the package name, e.g. unitconv")],
    dir: Annotated[Path, typer.Option("--dir", help="folder to create the project in")] = Path("."),
) -> None:
    """Start your own environment: write a working starter package NAME/.

    A unit-conversion environment with a tool, its verifier, a config and tests, to change
    into yours."""
    from tracerl.scaffold import CLASS, init_project

    try:  # a UserError (bad name, existing folder) is printed by the command group
        target = init_project(name, dir)
    except OSError as e:
        raise fail(f"cannot write {dir / name}: {e.strerror or e}") from None
    shown = os.path.relpath(target) if not target.is_absolute() else str(target)
    steps = [
        f"created {shown}/ (a unit-conversion environment to make your own). Next:",
        f"  cd {shown}",
        f"  tracerl check-env {name}.env:{CLASS}   # the contract every env must pass",
        f"  tracerl train configs/{name}.yaml   # a small RL run, written to runs/{name}/",
        "  python -m pytest tests   # the project's own tests",
        "Read its README.md, and docs/your-own-env.md in tracerl's documentation.",
    ]
    console.print("\n".join(steps), markup=False, highlight=False, soft_wrap=True)
