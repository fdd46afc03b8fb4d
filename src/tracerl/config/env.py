"""The ``env`` section: the environment, its parser, the tasks of training and evaluation."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from tracerl.config.base import _Config
from tracerl.envs.base import guard_value
from tracerl.envs.mcp.config import McpServer


class EnvConfig(_Config):
    name: str = "search"
    """The environment: a built-in (search, arithmetic, coderepair, refund_desk, reasoning_gym,
    openenv), an installed package's entry point (group ``tracerl.envs``), or an import path
    ``package.module:Class``."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Passed to `make(name, **kwargs)` (e.g. corpus, protocol)."""
    mcp: list[McpServer] = Field(default_factory=list)
    """MCP servers whose tools the environment (a ToolEnv) offers besides its own: each a
    ``command`` tracerl starts (stdio) or a ``url`` (streamable HTTP). Read-only tools run;
    the others are writes, budgeted and dry-run (docs/mcp.md, the ``mcp`` extra)."""
    side_effect_guard: Literal["dry_run", "off"] | None = None
    """What write tools do: ``dry_run`` (simulated: the intended effect is recorded, nothing
    changes) or ``off`` (writes run for real on tasks that allow them: a task's
    ``allow_real_writes``, or `allow_real_writes` here). None: the environment's own
    default (``dry_run`` for tracerl's). An unquoted ``off`` (which YAML reads as false) is
    ``off``."""
    allow_real_writes: bool = False
    """With ``side_effect_guard: off``: every task may write for real (an isolated tenant,
    a per-episode server), not only those that set ``allow_real_writes`` themselves."""
    parser: str | None = None
    """The action parser (the format the model writes tool calls in). None: the one a
    tracerl export names (``tracerl_export.json``), else the default of a model tracerl
    ships (smollm2, tiny-*); any other model needs it set (never guessed from a folder's
    name)."""
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
    """Tasks of `eval_split` each evaluation plays (``eval.samples_per_task`` episodes each,
    one by default): the same tasks every time (drawn from `trainer.seed`), so evaluations
    compare."""
    adversarial_eval_tasks: int = Field(0, ge=0)
    """Also evaluate this many tasks of the ``adversarial`` split (search: look-alike, dead
    link, conflict and timeout traps), each kind its own curve on the dashboard; 0: none."""

    @field_validator("side_effect_guard", mode="before")
    @classmethod
    def _guard(cls, v: Any) -> Any:
        return None if v is None else guard_value(v, "env.side_effect_guard")

    @model_validator(mode="after")
    def _real_writes(self) -> EnvConfig:
        given = self.kwargs.get("side_effect_guard")
        if given is not None:
            given = guard_value(given, "env.kwargs.side_effect_guard")
            if self.side_effect_guard not in (None, given):
                raise ValueError(
                    f"env.side_effect_guard is {self.side_effect_guard!r} but "
                    f"env.kwargs.side_effect_guard is {given!r}: set it once "
                    "(env.side_effect_guard)"
                )
        if self.allow_real_writes and (self.side_effect_guard or given) != "off":
            raise ValueError(
                "env.allow_real_writes: true needs env.side_effect_guard: off (with the guard "
                "on, every write is a dry run whatever the tasks allow)"
            )
        return self

    def env_kwargs(self) -> dict[str, Any]:
        """The environment's arguments: `kwargs`, with `side_effect_guard` when it is set."""
        if self.side_effect_guard is None:
            return dict(self.kwargs)
        return {**self.kwargs, "side_effect_guard": self.side_effect_guard}

    def factory(self) -> Any:
        """A fresh environment per episode (`tracerl.envs.registry.EnvFactory`: picklable,
        Ray workers build it too), as this section configures it."""
        from tracerl.envs.registry import env_factory

        return env_factory(
            self.name, self.env_kwargs(), self.mcp, real_writes=self.allow_real_writes
        )
