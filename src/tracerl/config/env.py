"""The ``env`` section: the environment, its parser, the tasks of training and evaluation."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from tracerl.config.base import _Config
from tracerl.envs.mcp.config import McpServer


class EnvConfig(_Config):
    name: str = "search"
    """The environment: a built-in (search, arithmetic, coderepair, refund_desk), an installed
    package's entry point (group ``tracerl.envs``), or an import path ``package.module:Class``."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Passed to `make(name, **kwargs)` (e.g. corpus, protocol)."""
    mcp: list[McpServer] = Field(default_factory=list)
    """MCP servers whose tools the environment (a ToolEnv) offers besides its own: each a
    ``command`` tracerl starts (stdio) or a ``url`` (streamable HTTP). Read-only tools run;
    the others are writes, budgeted and dry-run (docs/mcp.md, the ``mcp`` extra)."""
    parser: str | None = None
    """The action parser; None picks the model family's default."""
    tasks_per_step: int = Field(4, ge=1)
    """Training tasks drawn per RL step; each is played `trainer.group_size` times, so a step
    trains on ``tasks_per_step x group_size`` episodes."""
    train_split: str | None = None
    """The split training tasks come from; None: ``train`` if the environment declares it,
    else its first declared split (``train`` when it declares none)."""
    eval_split: str | None = None
    """The held-out split evaluations use; None: the first of heldout, test, validation, eval,
    dev the environment declares, else its first split other than the training split and
    ``adversarial`` (``heldout`` when it declares none). Naming the training split is allowed
    with a warning: evaluations then measure trained-on tasks."""
    eval_tasks: int = Field(20, ge=1)
    """Tasks of `eval_split` each evaluation plays, one episode each: the same tasks every
    time (drawn from `trainer.seed`), so evaluations compare."""
    adversarial_eval_tasks: int = Field(0, ge=0)
    """Also evaluate this many tasks of the ``adversarial`` split (search: look-alike, dead
    link, conflict and timeout traps), each kind its own curve on the dashboard; 0: none."""
