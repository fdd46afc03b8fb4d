"""The `tracerl` command. Each command parses its arguments, then calls one function.

One module per family of commands, each importing only `tracerl.cli.common` and lower layers,
never another command module:

    demo.py       version, demo, load-model
    runs.py       show, report, triage, replay
    envs.py       list, check-env, serve-retriever, init
    train.py      train, sft, export
    review.py     review
    readiness.py  readiness
    evaluate.py   eval
    serve.py      serve, gateway

A user's mistake (a `tracerl.errors.UserError`: a bad config, an unknown name, a missing
file) is printed in one or two lines, without a traceback, with exit status 2, before any
model is loaded; ``tracerl --debug COMMAND ...`` (or ``TRACERL_DEBUG=1``) shows the traceback
(`tracerl.cli.common.Commands`). Command modules import lazily, inside each command: `tracerl
--help` never imports torch.
"""

from __future__ import annotations

import typer

from tracerl.cli import demo, envs, evaluate, readiness, review, runs, serve, train
from tracerl.cli.common import Commands, options

app = typer.Typer(
    cls=Commands,
    rich_markup_mode="markdown",  # a docstring paragraph reflows: no line cut mid-sentence
    help="tracerl: train tool-using LLM agents with RL, with rollouts you can trust.",
    no_args_is_help=True,
    add_completion=False,
)
app.callback()(options)

# in the order `tracerl --help` lists them: a first run, training, reading runs, your own
# environment, servers, then the rest
app.command("demo")(demo.demo)
app.command("train")(train.train)
app.command("eval")(evaluate.eval_command)
app.command("show")(runs.show)
app.command("replay")(runs.replay)
app.command("triage")(runs.triage)
app.command("report")(runs.report)
app.command("review")(review.review)
app.command("list")(envs.list_command)
app.command("init")(envs.init_command)
app.command("check-env")(envs.check_env_cmd)
app.command("readiness")(readiness.readiness)
app.command("sft")(train.sft)
app.command("export")(train.export)
app.command("serve")(serve.serve_command)
app.command("gateway")(serve.gateway_command)
app.command("serve-retriever")(envs.serve_retriever)
app.command("load-model")(demo.load_model)
app.command("version")(demo.version)

__all__ = ["app"]
