"""Training from Python: `tracerl.train(...)` and `tracerl.Run` (docs/api.md).

    import tracerl

    result = tracerl.train("configs/learn-arithmetic.yaml", trainer={"steps": 5})
    result.run_dir, result.success_rate, result.history[-1]

    run = tracerl.Run.from_config({"env": {"name": MyEnv}}, reward=my_reward, name="mine")
    result = run.train()

The config is built as `tracerl.train.configure` says (a `RunConfig`, a dict or a YAML
path; keyword sections; environment and reward objects; dotted overrides), checked as
`tracerl train` checks it, and trained by the same loop (`tracerl.train.loop`): the run
directory is the CLI's, and ``tracerl report RUN`` draws its dashboard. Progress goes to
`log` (print) as the summary lines of the command; ``log=None`` is silent.

A `UserError` (a mistake in the config, a name that resolves to nothing) is raised with its
hint attached as a note, so a traceback says what to do too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracerl.config import RunConfig
from tracerl.errors import UserError
from tracerl.report.run import metric_rows
from tracerl.train import run as _run
from tracerl.train.configure import Config
from tracerl.train.resume import refuse_existing_run

Log = Callable[[str], None]


@dataclass(frozen=True)
class TrainResult:
    """What a training run left: its folder and its last evaluation."""

    run_dir: Path
    """The run directory (``out_dir/name``): config.yaml, metrics.jsonl, episodes/,
    checkpoints/; ``tracerl report RUN_DIR`` draws its dashboard."""
    metrics: dict[str, float]
    """The last evaluation's metrics (``eval/<split>/...``); empty when the run stopped
    (Ctrl-C) before one."""
    config: RunConfig = field(repr=False)
    """The config that ran (the environment's split defaults filled in)."""

    def __repr__(self) -> str:
        return f"TrainResult(run_dir={str(self.run_dir)!r}, success_rate={self.success_rate})"

    @property
    def eval_split(self) -> str:
        """The held-out split evaluations played (``env.eval_split``)."""
        return self.config.env.eval_split or "heldout"

    @property
    def held_out(self) -> dict[str, float]:
        """The last evaluation on the held-out split, without its ``eval/<split>/`` prefix:
        ``success_rate``, ``reward_mean``, ``reward/<component>``, ``stop/...``."""
        prefix = f"eval/{self.eval_split}/"
        return {k.removeprefix(prefix): v for k, v in self.metrics.items() if k.startswith(prefix)}

    @property
    def success_rate(self) -> float | None:
        """Held-out success at the last evaluation (None without one)."""
        return self.held_out.get("success_rate")

    @property
    def history(self) -> list[dict[str, Any]]:
        """Every row of ``metrics.jsonl``, read now: ``{"step", "phase": "train" | "eval",
        ...}`` (docs/report.md names the metrics)."""
        return metric_rows(self.run_dir)


class Run(_run.Run):
    """A run built from a config, Python objects for its environment and reward, and
    overrides (`from_config`), that trains itself (`train`): `tracerl.train.run.Run`, the
    object every command builds, with the training loop at hand."""

    @classmethod
    def from_config(
        cls,
        config: Config = None,
        *,
        env: Any = None,
        reward: Any = None,
        overrides: list[str] | Mapping[str, Any] | None = None,
        **sections: Any,
    ) -> Run:
        """The run of `config` (a `RunConfig`, a dict of config keys, a YAML path, or None:
        the defaults) with keyword `sections` merged into it (``trainer={"steps": 3}``,
        ``name="x"``, ``model="tiny-chars"``), `env` (``env.name``: a name, an environment
        class or a factory; or the whole ``env`` section as a dict), `reward`
        (``trainer.reward``: a name, a function, a callable object, or a list of components)
        and `overrides` (dotted keys: ``["trainer.lr=1e-5"]`` or ``{"trainer.lr": 1e-5}``),
        in that order; checked before anything loads (`tracerl.train.configure`)."""
        with hinted():
            run = super().from_config(
                config, env=env, reward=reward, overrides=overrides, **sections
            )
        assert isinstance(run, Run)
        return run

    def train(self, *, resume: bool = False, log: Log | None = print) -> TrainResult:
        """Train (or `resume`, from the newest checkpoint) and evaluate, as ``tracerl train``
        does; progress lines go to `log` (None: silent)."""
        from tracerl.train.loop import train as run_training

        say: Log = log if log is not None else _silent
        cfg = self.cfg
        with hinted():
            if not resume:
                refuse_existing_run(
                    cfg.run_dir, "continue it with resume=True, or pick another name (name=...)"
                )
            for warning in self.prepared.warnings:
                say(f"warning: {warning}")
            metrics = run_training(cfg, resume=resume, log=say, run=self)
        return TrainResult(cfg.run_dir, dict(metrics), cfg)


def train(
    config: Config = None,
    *,
    env: Any = None,
    reward: Any = None,
    overrides: list[str] | Mapping[str, Any] | None = None,
    resume: bool = False,
    log: Log | None = print,
    **sections: Any,
) -> TrainResult:
    """Train a run and return its folder and metrics: ``Run.from_config(config, env=env,
    reward=reward, overrides=overrides, **sections).train(resume=resume, log=log)``.

        tracerl.train("configs/learn-arithmetic.yaml", trainer={"steps": 5})
        tracerl.train(env=MyEnv, reward=my_reward, model="tiny-chars", name="mine")
    """
    run = Run.from_config(config, env=env, reward=reward, overrides=overrides, **sections)
    return run.train(resume=resume, log=log)


@contextlib.contextmanager
def hinted() -> Iterator[None]:
    """A `UserError` leaves with its hint as a note (shown under its traceback)."""
    try:
        yield
    except UserError as e:
        if e.hint and e.hint not in getattr(e, "__notes__", ()):
            e.add_note(e.hint)
        raise


def _silent(_: str) -> None:
    pass
