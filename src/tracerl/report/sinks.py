"""Metrics sinks: ``metrics.jsonl`` always; TensorBoard and W&B (offline) when configured.

The run directory's ``metrics.jsonl`` is the record the report reads, so it is written
first and by every run; the other sinks are views for people who already live in those
tools. Each row is ``{"step", "phase", [stage], "<name>": number, ...}``; the other sinks get
its numbers as scalars at ``step``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Protocol

from tracerl.report.run import METRICS_FILE


def append_metrics(run_dir: str | os.PathLike[str], row: dict[str, Any]) -> None:
    """One line of ``metrics.jsonl`` in the run directory."""
    path = Path(run_dir) / METRICS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


def scalars(row: dict[str, Any]) -> dict[str, float]:
    """The row's numbers (``step`` and labels such as ``phase`` left out)."""
    return {
        k: float(v)
        for k, v in row.items()
        if k != "step" and isinstance(v, int | float) and not isinstance(v, bool)
    }


class Sink(Protocol):
    def log(self, row: dict[str, Any]) -> None: ...
    def close(self) -> None: ...


class JsonlSink:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    def log(self, row: dict[str, Any]) -> None:
        append_metrics(self.run_dir, row)

    def close(self) -> None:
        pass


class TensorBoardSink:
    """Event files under ``RUN/tensorboard`` (``tensorboard --logdir RUN/tensorboard``)."""

    def __init__(self, run_dir: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:  # torch imports tensorboard lazily, here
            raise ImportError(
                "report.sinks lists 'tensorboard' but the tensorboard package is missing: "
                "pip install 'tracerl[track]' (or drop it from report.sinks)"
            ) from e
        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def log(self, row: dict[str, Any]) -> None:
        for key, value in scalars(row).items():
            self.writer.add_scalar(key, value, global_step=int(row.get("step", 0)))
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """An offline W&B run under ``RUN/wandb`` (never contacts a server; ``wandb sync``
    uploads it later). Every metric is plotted against ``step``, so evaluations logged after
    a step's training row never trip W&B's monotonic-step rule."""

    def __init__(self, run_dir: Path, name: str, project: str, config: dict[str, Any]) -> None:
        try:
            import wandb
        except ImportError as e:
            raise ImportError(
                "report.sinks lists 'wandb' but the wandb package is missing: "
                "pip install 'tracerl[track]' (or drop it from report.sinks)"
            ) from e
        self.run = wandb.init(
            project=project,
            name=name,
            dir=str(run_dir),
            config=config,
            mode="offline",
            settings=wandb.Settings(silent=True, console="off", x_disable_stats=True),
        )
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")

    def log(self, row: dict[str, Any]) -> None:
        self.run.log({**scalars(row), "step": int(row.get("step", 0))})

    def close(self) -> None:
        self.run.finish()


class MetricsLog:
    """Every configured sink, behind one `log(row)`. ``metrics.jsonl`` comes first: a sink
    that fails later cannot cost the run its record."""

    def __init__(self, sinks: list[Sink]) -> None:
        self.sinks = sinks

    @classmethod
    def open(
        cls,
        run_dir: Path,
        kinds: list[str] | tuple[str, ...] = ("jsonl",),
        *,
        name: str = "run",
        project: str = "tracerl",
        config: dict[str, Any] | None = None,
    ) -> MetricsLog:
        sinks: list[Sink] = [JsonlSink(run_dir)]
        for kind in dict.fromkeys(kinds):
            if kind == "tensorboard":
                sinks.append(TensorBoardSink(run_dir))
            elif kind == "wandb":
                sinks.append(WandbSink(run_dir, name, project, config or {}))
            elif kind != "jsonl":
                raise ValueError(
                    f"report.sinks: unknown sink {kind!r}; valid: jsonl, tensorboard, wandb"
                )
        return cls(sinks)

    def log(self, row: dict[str, Any]) -> None:
        for sink in self.sinks:
            sink.log(row)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
