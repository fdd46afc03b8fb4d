"""The run's evaluations: held-out success (and each adversarial trap kind) at a stage of
training, written to the run directory and logged through the metrics sinks.

How they sample is the ``eval`` section's: at ``eval.temperature`` (0: greedy; None: the
training temperature), through a second sampler over the same weights (`eval_policy`: the
training sampler keeps its own temperature), each task played ``eval.samples_per_task``
times (k) with a seed per sample, reported as ``success_rate``, ``mean@k`` and ``pass@k``
with their standard errors (`tracerl.train.metrics.sample_metrics`). Episodes whose reward
could not decide wait for a person in ``RUN/review.sqlite``; each evaluation reports
``review_pending`` and ``reviewed_success_rate`` (`tracerl.train.review_queue`)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tracerl.config import ConfigError, RunConfig, dump_config
from tracerl.envs import FaultInjector
from tracerl.report.progress import QuietProgress
from tracerl.report.sinks import MetricsLog
from tracerl.rollout.groups import RolloutBackend, run_groups
from tracerl.rollout.persist import EpisodeWriter, done_episodes
from tracerl.rollout.runner import Policy
from tracerl.train.interrupt import cancellable
from tracerl.train.metrics import eval_metrics
from tracerl.train.review_queue import review_metrics


def evaluate(*args: Any, **kwargs: Any) -> dict[str, float]:
    """`evaluate_async` in an event loop of its own (synchronous training); cancelled by a
    stop request (`tracerl.train.interrupt`: an evaluation is redone whole on resume)."""
    return asyncio.run(cancellable(evaluate_async(*args, **kwargs)))


async def evaluate_async(
    cfg: RunConfig,
    env: Any,
    probe: Any,
    policy: Policy,
    reward: Any,
    sink: MetricsLog,
    step: int,
    bars: QuietProgress,
    stage: str = "train",
    backend: RolloutBackend | None = None,
) -> dict[str, float]:
    """The eval split's success at this point: ``stage`` is ``baseline`` (the model as
    loaded), ``warm_start`` (after the warm start) or ``train`` (after `step` RL steps).
    Episodes already written for this evaluation (before a crash) are reused."""
    run_dir = cfg.run_dir
    folder = run_dir / "eval" / stage if stage == "warm_start" else run_dir / "eval"
    policy = eval_policy(cfg, policy)
    k = cfg.eval.samples_per_task
    lookup = getattr(probe, "document", None)
    m: dict[str, float] = {}
    splits = [(cfg.env.eval_split, cfg.env.eval_tasks)]
    if cfg.env.adversarial_eval_tasks:
        splits.append(("adversarial", cfg.env.adversarial_eval_tasks))
    for split, n in splits:
        tasks = probe.sample_tasks(n, seed=cfg.trainer.seed, split=split)
        bars.phase(f"eval {split} ({stage} {step})", len(tasks) * k)
        where = folder if split == cfg.env.eval_split else folder / split
        episodes, by_task = [], []
        for _, batch, factory in task_batches(tasks, env, seed=cfg.trainer.seed):
            groups = await run_groups(
                factory,
                batch,
                policy,
                cfg.rollout,
                group_size=k,  # each sample its own member: its own seed and episode id
                seed=10**6 + step,
                # baseline and warm-start evaluations share step 0's seed: the stage (and a
                # second split) keep their episode ids apart
                stage=f"eval-{stage}" + ("" if split == cfg.env.eval_split else f"-{split}"),
                writer=EpisodeWriter(where, step),
                done=done_episodes(where, step),
                on_episode=bars.advance,
                score=reward.evaluating() if hasattr(reward, "evaluating") else reward,
                backend=backend,
            )
            episodes += [e for g in groups for e in g]
            by_task += groups
        m.update(eval_metrics(episodes, split, lookup, by_task))
        m.update(review_metrics(run_dir, episodes, f"eval/{split}/"))  # the review pool
    sink.log({"step": step, "phase": "eval", "stage": stage, **m})
    split = cfg.env.eval_split
    line = f"eval ({stage}, step {step}): {split} success " + _success(m, f"eval/{split}/")
    if k > 1 and f"eval/{split}/pass@{k}" in m:
        line += f", pass@{k} {m[f'eval/{split}/pass@{k}']:.3f}"
    pending = m.get(f"eval/{split}/review_pending", 0.0)
    if pending:  # answers no rule could decide: a person can
        line += f" ({pending:.0f} undecided, waiting for review: `tracerl review {run_dir}`)"
    infra = m.get(f"eval/{split}/stop/infra_failure", 0.0)
    if infra:  # a success rate that measured the infrastructure must say so
        line += (
            f" (warning: {infra:.0%} of its episodes were infrastructure failures, the "
            "environment's; they count as unsolved)"
        )
    evaluator = m.get(f"eval/{split}/attribution/episodes_evaluator", 0.0)
    if evaluator >= 0.5:  # a success rate the reward code could not measure must say so
        line += (
            f" (warning: the reward crashed on {evaluator:.0%} of its "
            f"episodes, the evaluator's; `tracerl triage {run_dir}` says why)"
        )
    bars.line(line)
    return m


def _success(m: dict[str, float], prefix: str) -> str:
    """``0.375 ± 0.171``, or why there is no figure (no episode decided)."""
    rate = m.get(f"{prefix}success_rate")
    if rate is None:
        return "undefined (no episode's reward decided)"
    return f"{rate:.3f} ± {m.get(f'{prefix}success_rate_stderr', 0.0):.3f}"


def eval_policy(cfg: RunConfig, policy: Policy) -> Policy:
    """The policy evaluations play: `policy` itself when ``eval.temperature`` is unset or
    is the sampler's, else the same model and parser with a second sampler over the same
    weights (or server) at the evaluation's temperature, made now (its policy version is the
    current one). The training sampler's temperature is never changed."""
    t = cfg.eval.temperature
    sampler = policy.sampler
    if t is None or t == getattr(sampler, "temperature", None):
        return policy
    at = getattr(sampler, "with_temperature", None)
    if at is None:
        raise ConfigError(
            f"eval.temperature={t}: this run's sampler ({type(sampler).__name__}) samples at "
            "the training temperature only",
            "leave eval.temperature unset",
        )
    return dataclasses.replace(policy, sampler=at(t, seed=cfg.trainer.seed))


def task_batches(
    tasks: list[dict[str, Any]], env: Callable[[], Any], *, seed: int
) -> list[tuple[str, list[dict[str, Any]], Callable[[], Any]]]:
    """``(kind, tasks, env factory)`` batches. Adversarial tasks run per trap kind: the
    ``timeout`` kind in an env where half of the tool steps time out (retries may recover);
    tasks without a kind run at once in `env`."""
    kinds = sorted({str(t.get("kind", "")) for t in tasks})
    out = []
    for kind in kinds:
        batch = [t for t in tasks if str(t.get("kind", "")) == kind]
        factory = env
        if kind == "timeout":

            def factory(env: Callable[[], Any] = env) -> Any:
                return FaultInjector(env(), rate=0.5, kinds=["timeout"], seed=seed)

        out.append((kind, batch, factory))
    return out


def evaluate_config(
    prepared: Any, out: Path, *, n: int | None = None, progress: QuietProgress | None = None
) -> dict[str, float]:
    """`tracerl eval CONFIG`: the config's model (as loaded) on its environment's eval split
    (and the adversarial split, if the config asks), scored by its reward, written to `out`
    as a run directory (stage ``baseline``, step 0). `prepared`: the checked config
    (`tracerl.preflight.prepare`), built into a `tracerl.train.run.Run` writing to `out`."""
    from tracerl.train.resume import refuse_existing_run
    from tracerl.train.run import Run

    refuse_existing_run(out, "pick another --out")
    env_cfg = prepared.cfg.env
    if n is not None:
        env_cfg = env_cfg.model_copy(update={"eval_tasks": n})
    update = {"out_dir": str(out.parent), "name": out.name, "env": env_cfg}
    run = Run(dataclasses.replace(prepared, cfg=prepared.cfg.model_copy(update=update)))
    cfg = run.cfg
    bars = progress or QuietProgress(print)
    run.rehearse()  # an environment that cannot reset fails here, not in every episode
    bars.line(f"eval {out}: loading {cfg.model.spec} ...")
    run.policy  # noqa: B018  (the model loads before anything is written)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(dump_config(cfg))
    sink = run.sink(out, ["jsonl"])
    try:
        # the engine starts on the weights as loaded (a server: they are its base weights)
        with (
            run.engine(out, bars.line) as engine,
            run.rollouts(engine, workers=False) as backend,
        ):
            return evaluate(
                cfg,
                run.env,
                run.probe,
                engine.policy,
                run.reward,
                sink,
                0,
                bars,
                "baseline",
                backend,
            )
    finally:
        sink.close()
