"""`tracerl train`: synchronous GRPO on a real environment, with evaluation and checkpoints.

    baseline evaluation on the eval split (stage "baseline")
    optional warm start: SFT on the env's reference agent, checkpoint "step -1", evaluation
        (stage "warm_start")
    for each step:
        the step's tasks (a function of seed and step: the data order survives a resume)
        -> grpo_step: sample G episodes per task (each written to the run directory as it
           finishes; episodes already on disk from an interrupted attempt are reused),
           reward, eligibility, advantages (with dynamic sampling: replacement groups for
           those without signal, `tracerl.train.dynamic_sampling`), update
        -> one line in metrics.jsonl; a checkpoint every N steps
        -> the engine (`tracerl.engines`: the trainer's own model, or a vLLM server, asleep
           during the update with model.vllm.sleep_mode) given the new weights before the
           next rollouts
        -> evaluation every N steps
    final evaluation

Resume (`--resume`) restores the newest checkpoint (model, optimizer, RNGs, policy version)
and continues at the next step; every episode already written is reused, none is sampled
twice. Ctrl-C (or SIGTERM) is acknowledged at once and stops the run at its phase's next
safe point, printing the command that resumes it; a second Ctrl-C aborts at once
(`tracerl.train.interrupt`).
"""

from __future__ import annotations

import asyncio
import shlex
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
from tracerl.train.configure import python_objects_note
from tracerl.train.distill import coverage_warning
from tracerl.train.evaluation import evaluate, evaluate_async
from tracerl.train.futility import Futility
from tracerl.train.grpo import GRPOConfig, grpo_step
from tracerl.train.interrupt import Interrupts, StopRun, set_phase, starting
from tracerl.train.learner import Learner
from tracerl.train.metrics import citation_metrics, shown
from tracerl.train.resume import check_start, has_eval, trim_metrics
from tracerl.train.review_queue import queue_undecided
from tracerl.train.run import Run
from tracerl.train.warm_start import warm_start_stage

Log = Callable[[str], None]


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
    check_start(run_dir, cfg.model_dump(mode="json"), resume)
    ckpt = latest_checkpoint(run_dir) if resume else None
    command = f"tracerl train {shlex.quote(str(run_dir / 'config.yaml'))} --resume"
    try:
        with starting():
            return _start(run, ckpt, resume, bars, command)
    except KeyboardInterrupt:  # Ctrl-C while starting, before the run's own handlers
        written = (run_dir / "config.yaml").is_file()
        bars.line(
            "Ctrl-C while starting (checking the environment, loading the model, starting "
            "the engine): stopped before anything was trained. "
            + (f"Resume with: {command}" if written else "Nothing was written.")
        )
        raise


def _start(run: Run, ckpt: Any, resume: bool, bars: QuietProgress, command: str) -> dict:
    """Write the run's config, load the model, start the engine and train under the run's
    Ctrl-C handlers (`Interrupts`)."""
    cfg, run_dir = run.cfg, run.cfg.run_dir
    run.rehearse()  # one reset and one scoring, before the model loads and the run is written
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(python_objects_note(cfg) + dump_config(cfg))
    bars.line(f"run {run_dir}: loading {cfg.model.spec} on {run.placement.describe()} ...")
    run.policy  # noqa: B018  (the model loads before any sink opens)
    sink = run.sink(run_dir)
    try:
        with run.engine(run_dir, bars.line) as engine, run.rollouts(engine) as backend:
            final: dict[str, float] = {}  # the latest evaluation's metrics
            with Interrupts(command) as interrupts:
                try:
                    return _train(run, ckpt, resume, engine, sink, bars, backend, interrupts, final)
                except StopRun as e:
                    bars.line(
                        interrupts.stopped(
                            f"during {e.phase}; the episodes finished so far are kept"
                        )
                    )
                    return final
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
    stop: Interrupts,
    final: dict[str, float],
) -> dict[str, float]:
    """The run's phases; `final` holds the latest evaluation's metrics (what a stop
    returns)."""
    cfg, bundle, env, probe, reward = run.cfg, run.bundle, run.env, run.probe, run.reward
    log, run_dir, t = bars.line, cfg.run_dir, cfg.trainer
    policy = engine.policy
    sampler = policy.sampler  # its policy_version is the run's
    if t.micro_batch_tokens == "auto":
        log(f"trainer.micro_batch_tokens {run.micro_batch_sizing[1]}")

    def evaluation(step: int, stage: str = "train") -> dict[str, float]:
        set_phase(
            {
                "baseline": "the baseline evaluation",
                "warm_start": "the warm start's evaluation",
            }.get(stage, f"the evaluation after step {step - 1}")
        )
        m = evaluate(cfg, env, probe, policy, reward, sink, step, bars, stage, backend)
        final.clear()
        final.update(m)
        return final

    def evaluate_after(step: int) -> bool:
        return step == t.steps - 1 or bool(t.eval_every and (step + 1) % t.eval_every == 0)

    def publish() -> None:  # a server the learner does not own gets the current weights
        (backend or engine).publish(bundle.model, sampler.policy_version)

    async def evaluation_async(step: int) -> dict[str, float]:
        return await evaluate_async(
            cfg, env, probe, policy, reward, sink, step, bars, backend=backend
        )

    if ckpt is None:
        if resume:
            trim_metrics(run_dir, None)  # nothing was checkpointed: every line is redone
            log("resumed with no checkpoint: starting again, reusing written episodes")
        # step 0's baseline: the model as loaded
        publish()
        evaluation(0, "baseline")
        if cfg.warm_start is not None:
            set_phase("the warm start")
            warm_start_stage(
                cfg,
                bundle,
                env,
                probe,
                policy,
                reward,
                sink,
                bars,
                backend,
                publish,
                micro_batch_tokens=run.micro_batch_sizing[0],
            )
            _checkpoint(run, -1, None, sampler, log)  # no RL step yet: no optimizer state
            if stop.requested:  # during the fine-tuning, which finished: it is kept
                log(stop.stopped("after the warm start (checkpoint written)"))
                return final
            evaluation(0, "warm_start")
    learner = run.learner()  # across ranks under torchrun
    learner.progress = bars  # an update's micro-batches on the bars
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
        warm = cfg.warm_start is not None and ckpt.step == -1
        if warm and not has_eval(run_dir, 0, stage="warm_start"):
            evaluation(0, "warm_start")  # stopped after the warm start, before its evaluation
        if ckpt.step >= 0 and evaluate_after(ckpt.step) and not has_eval(run_dir, start):
            # stopped after the step, before (or during) the evaluation that follows it
            evaluation(start)
    grpo = run.grpo
    bars.steps(t.steps, done=min(start, t.steps))
    futility = Futility(t.stop_unlearnable_steps, run_dir)

    # the last step whose update is in the weights, and the last one checkpointed
    updated = {"step": ckpt.step if ckpt is not None else None}
    saved = dict(updated)

    def checkpoint(step: int) -> None:
        _checkpoint(run, step, learner, sampler, log)
        saved["step"] = step

    def record(step: int, m: dict[str, float], episodes: list[Episode], t0: float) -> bool:
        """Log the step and checkpoint; False when a signal asked to stop."""
        if hasattr(probe, "document"):
            cites = citation_metrics(episodes, probe.document)
            m.update({f"train/{k}": v for k, v in cites.items()})
        queue_undecided(run_dir, episodes)  # undecided: wait for a person, in review.sqlite
        m.update(engine.metrics())  # the weight sync before this step, restarts so far
        m["time/step_s"] = time.perf_counter() - t0
        sink.log({"step": step, "phase": "train", **m})
        log(
            f"step {step}: reward {shown(m.get('train/reward_mean'))}, "
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
        updated["step"] = step
        if last or stop.requested or futile is not None:
            checkpoint(step)
        if futile is not None:  # written and resumable: --resume goes on once it is fixed
            raise futile
        if stop.requested:
            log(stop.stopped(f"after step {step} (checkpoint written)"))
        publish()  # before the evaluation after the step and the next step's rollouts
        return not stop.requested

    if t.mode == "async":
        set_phase("asynchronous training")
        out = asyncio.run(
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
        return out or final
    try:
        for step in range(start, t.steps):
            if stop.requested:  # between phases: stop before a new step
                log(stop.stopped(f"before step {step}"))
                return final
            t0 = time.perf_counter()
            set_phase(f"step {step}")
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
                before_update=engine.pause,  # a vLLM server in sleep mode sleeps meanwhile
            )
            if not record(step, m, episodes, t0):
                return final
            if evaluate_after(step):
                evaluation(step + 1)
    except StopRun:
        # rollouts or an evaluation were cancelled: the last update is kept all the same
        if updated["step"] is not None and updated["step"] != saved["step"]:
            checkpoint(updated["step"])
        raise
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
    total = (t.steps - start) * cfg.env.tasks_per_step * t.group_size
    sampled, evaluating = [0], [False]
    bars.phase("async rollouts", total)

    def sampled_one(_: Episode) -> None:  # an evaluation's bar counts its own episodes only
        sampled[0] += 1
        if not evaluating[0]:
            bars.advance()

    async def after(step: int, m: dict[str, float], episodes: list[Episode]) -> bool:
        nonlocal final
        go = record(step, m, episodes, last[0])
        if go and evaluate_after(step):
            evaluating[0] = True
            try:
                final = await evaluation(step + 1)
            finally:
                evaluating[0] = False
            bars.phase("async rollouts", max(total, sampled[0]), sampled[0])
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
        on_episode=sampled_one,
        backend=backend,
    )
    return final


def _checkpoint(run: Run, step: int, learner: Learner | None, sampler: Any, log: Any) -> None:
    """Write the checkpoint after `step` (-1: the warm start's), saying so as it goes."""
    t = run.cfg.trainer
    save_checkpoint(
        run.cfg.run_dir,
        step,
        run.bundle.model,
        learner,
        sampler,
        {"seed": t.seed},
        keep=t.keep_last,
        log=log,
    )
