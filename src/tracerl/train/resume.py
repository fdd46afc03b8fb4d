"""What `--resume` may change: how the run executes and reports, never what it learns.

A resumed run continues the same experiment. Its receipts, checkpoints and curves were made
under the config in ``RUN/config.yaml``; resuming with another environment, reward, model or
learning rate would mix two experiments under one name. So a resume is refused (with the
keys that differ) unless only these change: more or fewer steps, evaluation and checkpoint
cadence, compilation and memory settings, how many processes the learner spans and how
(`trainer.learner`: checkpoints are the same for every strategy), where rollouts run and
what samples them (the engine), and the metric sinks.

`trim_metrics` and `has_eval` put ``metrics.jsonl`` back where the checkpoint stands: lines
of steps it does not contain are redone, so they are dropped first.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from tracerl.config import RunConfig
from tracerl.errors import UserError
from tracerl.report.run import metric_rows


class RunExistsError(UserError, RuntimeError):
    """The run directory holds a run already (continue it with --resume)."""


def refuse_existing_run(run_dir: Path, hint: str) -> None:
    """A run directory with metrics is a run: never written into by a new one."""
    if (run_dir / "metrics.jsonl").exists():
        raise RunExistsError(f"{run_dir} already holds a run", hint)


def check_start(run_dir: Path, config: dict[str, Any], resume: bool) -> None:
    """What `tracerl train` checks of its run directory before it starts (`config`: the run's
    config as JSON): a run to resume is there and resumed with its own config; a new run
    never goes where one is. Torch-free: the command runs it before the learner loads."""
    if resume:
        check_resumable(run_dir, config)
    else:
        refuse_existing_run(run_dir, "continue it with --resume, or pick another name (name=...)")


MAY_CHANGE = (  # how it runs and where it is, not what it learns
    "name",
    "out_dir",
    "trainer.steps",
    "trainer.eval_every",
    "trainer.checkpoint_every",
    "trainer.compile",
    "trainer.gradient_checkpointing",
    "trainer.micro_batch_tokens",
    "trainer.learner",
    "trainer.rollout",
    "model.max_batch_size",
    "model.device",
    "model.engine",
    "model.vllm",
    "report",
)


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict) and data:
        out: dict[str, Any] = {}
        for k, v in data.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): data}


def check_resumable(run_dir: Path, config: dict[str, Any]) -> None:
    """Refuse to resume a run that is not there, or with a config that changes what it
    learns (`config`: the new config as JSON)."""
    path = run_dir / "config.yaml"
    if not path.exists():
        raise UserError(
            f"{run_dir}: no run to resume (no config.yaml there)",
            "start it without --resume",
        )
    before, after = _flat(yaml.safe_load(path.read_text()) or {}), _flat(config)
    # a key the run's config lacks is one a later tracerl added: at its default, the run
    # was made under it (without the key, tracerl behaved as the default says)
    defaults = _flat(RunConfig().model_dump(mode="json"))
    changed = [
        k
        for k in sorted(set(before) | set(after))
        if before.get(k) != after.get(k)
        and not k.startswith(MAY_CHANGE)
        and not (k not in before and k in defaults and after.get(k) == defaults[k])
    ]
    if changed:
        shown = ", ".join(f"{k} ({before.get(k)!r} -> {after.get(k)!r})" for k in changed[:3])
        more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
        raise UserError(
            f"{run_dir} was started with another config: {shown}{more}",
            f"resume with its own ({path}), changing only how it runs (trainer.steps, "
            "eval_every, checkpoint_every, trainer.rollout, report), or start a new run",
        )


def trim_metrics(run_dir: Path, step: int | None) -> None:
    """Drop metric lines of steps the checkpoint (of `step`; None: no checkpoint) does not
    contain: they will be redone. The evaluation after the checkpointed step is kept."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return
    keep = [
        row
        for row in metric_rows(run_dir)
        if step is not None
        and row.get("step", 0) <= (step if row.get("phase") == "train" else step + 1)
    ]
    tmp = path.with_name(".metrics.jsonl.tmp")
    tmp.write_text("".join(json.dumps(row) + "\n" for row in keep))
    tmp.replace(path)


def has_eval(run_dir: Path, step: int, stage: str | None = None) -> bool:
    """Whether an evaluation (of `stage`, when given) after `step` steps is logged."""
    return any(
        r.get("phase") == "eval" and r.get("step") == step and stage in (None, r.get("stage"))
        for r in metric_rows(run_dir)
    )
