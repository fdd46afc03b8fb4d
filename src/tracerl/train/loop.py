"""`tracerl train`: synchronous GRPO on a real environment, with evaluation and checkpoints.

    baseline evaluation on the eval split (stage "baseline")
    optional warm start: SFT on the env's reference agent, evaluation (stage "warm_start"),
        checkpoint "step -1"
    for each step:
        the step's tasks (a function of seed and step: the data order survives a resume)
        -> grpo_step: sample G episodes per task (each written to the run directory as it
           finishes; episodes already on disk from an interrupted attempt are reused),
           reward, eligibility, advantages (with dynamic sampling: replacement groups for
           those without signal, `tracerl.train.dynamic_sampling`), update
        -> one line in metrics.jsonl; a checkpoint every N steps
        -> the engine (`tracerl.engines`: the trainer's own model, or a vLLM server) given
           the new weights before the next rollouts
        -> evaluation every N steps
    final evaluation

Resume (`--resume`) restores the newest checkpoint (model, optimizer, RNGs, policy version)
and continues at the next step; every episode already written is reused, none is sampled
twice. SIGINT/SIGTERM finish the current step, write a checkpoint and exit cleanly.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Awaitable, Callable
from typing import Any

from tracerl.config import RunConfig, dump_config
from tracerl.engines import Engine
from tracerl.preflight import Prepared, prepare
from tracerl.report.progress import QuietProgress
from tracerl.report.sinks import MetricsLog
from tracerl.rollout.episode import ScoreFn
from tracerl.rollout.groups import RolloutBackend
from tracerl.rollout.persist import EpisodeWriter, done_episodes
from tracerl.rollout.runner import Episode, Policy
from tracerl.train.async_loop import AsyncSettings, consumed_before, ledger_writer, train_async
from tracerl.train.checkpoint import latest_checkpoint, restore, save_checkpoint
from tracerl.train.distill import coverage_warning
from tracerl.train.evaluation import evaluate, evaluate_async
from tracerl.train.futility import Futility
from tracerl.train.grpo import GRPOConfig, grpo_step
from tracerl.train.learner import Learner
from tracerl.train.metrics import citation_metrics
from tracerl.train.resume import check_resumable, has_eval, refuse_existing_run, trim_metrics
from tracerl.train.run import Run
from tracerl.train.warm_start import warm_start_stage

Log = Callable[[str], None]


class _Stop:
    """SIGINT/SIGTERM: finish the step, checkpoint, exit cleanly."""

    def __init__(self) -> None:
        self.requested = False
        self._old = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True

    def restore(self) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)


def train(
    cfg: RunConfig,
    *,
    resume: bool = False,
    log: Log = print,
    progress: QuietProgress | None = None,
    prepared: Prepared | None = None,
    run: Run | None = None,
) -> dict[str, float]:
    """Run (or `resume`) the configured training; returns the last evaluation's metrics.
    `progress` draws bars (`RichProgress`); without it, summary lines go to `log`. The config
    is checked first (`tracerl.preflight.prepare`, unless `prepared` is its result, or `run`
    was built from it)."""

    bars = progress or QuietProgress(log)
    # refuses what the run cannot complete, before writing
    run = run or Run(prepared or prepare(cfg))
    cfg = run.cfg
    run_dir = cfg.run_dir
    if resume:
        check_resumable(run_dir, cfg.model_dump(mode="json"))
    ckpt = latest_checkpoint(run_dir) if resume else None
    if not resume:
        refuse_existing_run(run_dir, "continue it with --resume, or pick another name (name=...)")
    run.rehearse()  # one reset and one scoring, before the model loads and the run is written
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(dump_config(cfg))
    run.policy  # noqa: B018  (the model loads before any sink opens)
    sink = run.sink(run_dir)
    try:
        with run.engine(run_dir, bars.line) as engine, run.rollouts(engine) as backend:
            return _train(run, ckpt, resume, engine, sink, bars, backend)
    finally:
        sink.close()


def _train(
    run: Run,
    ckpt: Any,
    resume: bool,
    engine: Engine,
    sink: MetricsLog,
    bars: QuietProgress,
    backend: RolloutBackend | None,
) -> dict[str, float]:
    cfg, bundle, env, probe, reward = run.cfg, run.bundle, run.env, run.probe, run.reward
    log, run_dir, t = bars.line, cfg.run_dir, cfg.trainer
    policy = engine.policy
    sampler = policy.sampler  # its policy_version is the run's

    def evaluation(step: int, stage: str = "train") -> dict[str, float]:
        return evaluate(cfg, env, probe, policy, reward, sink, step, bars, stage, backend)

    def publish() -> None:  # a server the learner does not own gets the current weights
        (backend or engine).publish(bundle.model, sampler.policy_version)

    async def evaluation_async(step: int) -> dict[str, float]:
        return await evaluate_async(
            cfg, env, probe, policy, reward, sink, step, bars, backend=backend
        )

    final: dict[str, float] = {}
    if ckpt is None:
        if resume:
            trim_metrics(run_dir, None)  # nothing was checkpointed: every line is redone
            log("resumed with no checkpoint: starting again, reusing written episodes")
        # step 0's baseline: the model as loaded
        publish()
        final = evaluation(0, "baseline")
        if cfg.warm_start is not None:
            final = warm_start_stage(
                cfg, bundle, env, probe, policy, reward, sink, bars, backend, publish
            )
            save_checkpoint(
                run_dir, -1, bundle.model, None, sampler, {"seed": t.seed}, keep=t.keep_last
            )
    learner = run.learner()  # across ranks under torchrun
    if backend is not None and hasattr(sampler, "_model_lock"):
        # a turn served from the learner's weights may still run (for a lost worker) during
        # an update
        learner.weights_lock = sampler._model_lock
    start = 0
    if ckpt is not None:
        restore(ckpt, bundle.model, learner, sampler)
        publish()
        start = ckpt.step + 1
        trim_metrics(run_dir, ckpt.step)
        log(f"resumed from {ckpt.path} (step {ckpt.step}, policy version {ckpt.policy_version})")
        if start >= t.steps and not has_eval(run_dir, t.steps):
            # stopped after the last step, before its evaluation
            final = evaluation(t.steps)
    grpo = run.grpo
    bars.steps(t.steps, done=min(start, t.steps))
    stop = _Stop()
    futility = Futility(t.stop_unlearnable_steps, run_dir)

    def record(step: int, m: dict[str, float], episodes: list[Episode], t0: float) -> bool:
        """Log the step and checkpoint; False when a signal asked to stop."""
        if hasattr(probe, "document"):
            cites = citation_metrics(episodes, probe.document)
            m.update({f"train/{k}": v for k, v in cites.items()})
        m.update(engine.metrics())  # the weight sync before this step, restarts so far
        m["time/step_s"] = time.perf_counter() - t0
        sink.log({"step": step, "phase": "train", **m})
        log(
            f"step {step}: reward {m['train/reward_mean']:.3f}, "
            f"loss {m.get('train/loss', 0.0):.4f}, {m['time/step_s']:.1f} s"
        )
        evaluator = m.get("attribution/episodes_evaluator", 0.0)
        if evaluator >= 0.5:  # a broken verifier must not pass for a policy that learns nothing
            log(
                f"warning: step {step}: {evaluator:.0%} of the episodes are the evaluator's "
                "(the reward crashed or could not decide; they never train the policy): "
                f"`tracerl triage {run_dir}` says why"
            )
        bars.step_done()
        if warning := coverage_warning(step, m):  # a teacher that left samples out
            log(warning)
        futile = futility.observe(step, episodes, m)
        last = (step + 1) % t.checkpoint_every == 0 or step == t.steps - 1
        if last or stop.requested or futile is not None:
            save_checkpoint(
                run_dir, step, bundle.model, learner, sampler, {"seed": t.seed}, keep=t.keep_last
            )
        if futile is not None:  # written and resumable: --resume goes on once it is fixed
            raise futile
        if stop.requested:
            log(f"stopped by a signal after step {step}; checkpoint written")
        publish()  # before the evaluation after the step and the next step's rollouts
        return not stop.requested

    def evaluate_after(step: int) -> bool:
        return step == t.steps - 1 or bool(t.eval_every and (step + 1) % t.eval_every == 0)

    try:
        if t.mode == "async":
            return (
                asyncio.run(
                    _train_async(
                        cfg,
                        env,
                        policy,
                        learner,
                        reward,
                        grpo,
                        start,
                        run.tasks,
                        record,
                        evaluate_after,
                        evaluation_async,
                        bars,
                        backend,
                    )
                )
                or final
            )
        for step in range(start, t.steps):
            if stop.requested:  # a signal during the last evaluation: stop before a new step
                log(f"stopped by a signal before step {step}")
                return final
            t0 = time.perf_counter()
            bars.phase(f"step {step} rollouts", cfg.env.tasks_per_step * t.group_size)
            m, episodes = grpo_step(
                env,
                run.tasks(step),
                policy,
                learner,
                reward,
                grpo,
                step=step,
                writer=EpisodeWriter(run_dir, step),
                done=done_episodes(run_dir, step),
                on_episode=bars.advance,
                backend=backend,
                refill=run.refill(step),
            )
            if not record(step, m, episodes, t0):
                return final
            if evaluate_after(step):
                final = evaluation(step + 1)
    finally:
        stop.restore()
    return final


async def _train_async(
    cfg: RunConfig,
    env: Any,
    policy: Policy,
    learner: Learner,
    reward: ScoreFn,
    grpo: GRPOConfig,
    start: int,
    tasks_of: Callable[[int], list[dict[str, Any]]],
    record: Callable[..., bool],
    evaluate_after: Callable[[int], bool],
    evaluation: Callable[[int], Awaitable[dict[str, float]]],
    bars: QuietProgress,
    backend: RolloutBackend | None,
) -> dict[str, float]:
    """The steps of an asynchronous run (`tracerl.train.async_loop`); evaluations run in the
    same event loop, between updates, while the rollout workers keep sampling."""
    t, run_dir = cfg.trainer, cfg.run_dir
    final: dict[str, float] = {}
    last = [time.perf_counter()]
    bars.phase("async rollouts", (t.steps - start) * cfg.env.tasks_per_step * t.group_size)

    async def after(step: int, m: dict[str, float], episodes: list[Episode]) -> bool:
        nonlocal final
        go = record(step, m, episodes, last[0])
        if go and evaluate_after(step):
            final = await evaluation(step + 1)
        last[0] = time.perf_counter()
        return go

    await train_async(
        env,
        tasks_of,
        policy,
        learner,
        reward,
        grpo,
        AsyncSettings(
            t.steps,
            start,
            t.max_staleness,
            t.staleness_lr,
            max_outstanding_groups=t.max_outstanding_groups,
            consumed=consumed_before(run_dir, start),
        ),
        ledger=ledger_writer(run_dir),
        writer=lambda b: EpisodeWriter(run_dir, b),
        done=lambda b: done_episodes(run_dir, b),
        after_step=after,
        on_episode=bars.advance,
        backend=backend,
    )
    return final
