"""`tracerl readiness CONFIG`: the configured policy, environment and reward, measured."""

from __future__ import annotations

import asyncio
import json
import math
import shutil
import tempfile
from pathlib import Path
from typing import Any

from tracerl.config import RunConfig
from tracerl.readiness.verdict import Readiness, judge, measure_readiness

KEY_NUMBERS = {
    "verifier": (
        "self_disagreement_rate",
        "perturbation_disagreement_rate",
        "evaluator_error_rate",
        "undecided_rate",
    ),
    "environment": ("reset_nondeterministic_rate", "replay_drift_rate", "env_error_rate"),
    "headroom": (
        "pass_at_1",
        "pass_at_k",
        "groups_varying",
        "format_valid_rate",
        "compare_pass_at_1",
        "compare_format_valid_rate",
    ),
    "cost": ("episode_s_mean", "step_s", "run_s", "tokens_per_episode", "possible_gain"),
}


def readiness_from_config(
    cfg: RunConfig, *, episodes: int | None = None, compare: str | None = None
) -> Readiness:
    """One step's worth of episodes (``env.tasks_per_step x trainer.group_size``, or about
    `episodes`) with the configured policy; `compare`: a model spec (an SFT checkpoint,
    ``hf:DIR``) measured on the same tasks."""
    from tracerl.train.run import Run

    run = Run.from_config(cfg)
    cfg, t = run.cfg, run.cfg.trainer
    k = t.group_size
    n_tasks = max(1, math.ceil(episodes / k)) if episodes else cfg.env.tasks_per_step
    tasks = run.tasks(0, n_tasks)
    run.rehearse()  # an environment that cannot reset fails here, not in every episode
    run.policy  # noqa: B018  (the run's model loads first)
    other = run.policy_of(compare) if compare else None  # `compare` samples in process
    # model.engine: vllm samples on a vLLM server of its own, logged in a temporary folder
    scratch = Path(tempfile.mkdtemp(prefix="tracerl-readiness-"))
    with (
        run.engine(scratch, log=lambda line: None) as engine,
        run.rollouts(engine, workers=False) as backend,
    ):
        numbers = asyncio.run(
            measure_readiness(
                run.env,
                tasks,
                engine.policy,
                run.reward,
                cfg.rollout,
                group_size=k,
                steps=t.steps,
                model=run.bundle.model,
                learner_config=run.learner_config,
                compare=other,
                seed=t.seed,
                backend=backend,
            )
        )
    shutil.rmtree(scratch, ignore_errors=True)
    result = judge(numbers)
    result.config = {
        "name": cfg.name,
        "model": cfg.model.spec,
        "env": cfg.env.name,
        "tasks": len(tasks),
        "group_size": k,
        "compare": compare,
    }
    return result


def print_readiness(r: Readiness, console: Any, *, as_json: bool = False) -> None:
    """The JSON report alone, or a table and the recommendation."""
    if as_json:
        print(json.dumps(r.to_json(), indent=2))
        return
    from rich.table import Table

    c = r.config
    table = Table(title=f"readiness of {c.get('name')}: {c.get('model')} on {c.get('env')}")
    for column in ("question", "verdict", "numbers", "why"):
        table.add_column(column, overflow="fold")
    for row in table_rows(r):
        table.add_row(*row)
    console.print(table)
    console.print(f"recommendation ({r.action}): {r.recommendation}", markup=False)


def table_rows(r: Readiness) -> list[tuple[str, str, str, str]]:
    """(question, verdict, numbers, reasons) per check, for the terminal table."""
    rows = []
    for c in r.checks:
        nums = ", ".join(
            f"{k} {_fmt(c.numbers[k])}" for k in KEY_NUMBERS[c.question] if k in c.numbers
        )
        rows.append((c.title, c.verdict.upper(), nums, "\n".join(c.reasons) or "-"))
    return rows


def _fmt(v: float) -> str:
    if math.isnan(v):
        return "n/a"
    return f"{v:.3f}" if abs(v) < 10 else f"{v:.0f}"
