"""Warm start: supervised fine-tuning on a reference agent's episodes, before RL.

A 135M model has never seen this environment's action format, so it succeeds on no task and
GRPO has no signal (every group scores 0: zero advantage everywhere). The warm start gives it
the format:

    the environment's own reference script (`env.check_script(task)`, what `check-env` runs)
    -> written in the model's action format by the parser (`format_calls`, `format_answer`)
    -> played through the rollout engine by a scripted sampler, exactly like model episodes
       (same template, same provenance masks, same receipts; written to ``warm_start/``);
       in an agent run (`agent:`), through the agent itself, over the gateway: the turns
       are trained in the conversation the harness builds around them, as RL will see it
    -> scored by the run's reward; successful, gradient-eligible episodes only
    -> `sft`: loss on the policy tokens only (the reference's own turns).

Its cost and effect are reported apart from RL: an evaluation right after the warm start is
the baseline that GRPO has to beat.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tracerl.config import RunConfig
from tracerl.envs.parsers import ActionParser
from tracerl.report.progress import QuietProgress
from tracerl.report.sinks import MetricsLog
from tracerl.rollout.budget import RolloutConfig
from tracerl.rollout.episode import ScoreFn
from tracerl.rollout.groups import RolloutBackend, run_groups
from tracerl.rollout.persist import EpisodeWriter, done_episodes
from tracerl.rollout.reference import reference_policy
from tracerl.rollout.runner import Episode, Policy
from tracerl.train.interrupt import cancellable
from tracerl.train.metrics import gradient_eligible
from tracerl.train.sft import sft


def summary_instruction(rollout: RolloutConfig) -> str | None:
    """What asks the policy for a summary, when its context compacts with policy-written
    summaries (the reference agent writes one there too); None otherwise."""
    c = rollout.context
    writes = c.policy == "compact" and c.summarizer.by == "policy"
    return c.summarizer.instruction if writes else None


def warm_start(
    bundle: Any,
    env: Callable[[], Any],
    probe: Any,
    parser: ActionParser,
    reward: ScoreFn,
    rollout: RolloutConfig,
    run_dir: Path,
    *,
    tasks: list[dict[str, Any]],
    lr: float,
    epochs: int,
    micro_batch_tokens: int,
    done: dict[str, Episode] | None = None,
    progress: Any = None,
    backend: RolloutBackend | None = None,
) -> dict[str, float]:
    """Play the reference on `tasks`, keep its successes, fine-tune `bundle.model` on them.
    With a `backend` (an agent harness's), the reference's turns are played through it: what
    is trained on is what the harness sends, as it renders the conversation."""
    t0 = time.perf_counter()
    if progress is not None:
        progress.phase("warm-start episodes", len(tasks))
    groups = asyncio.run(
        cancellable(  # a stop request: the reference episodes written so far are reused
            run_groups(
                env,
                tasks,
                reference_policy(
                    bundle.renderer, bundle.spec, probe, tasks, parser, summary_instruction(rollout)
                ),
                rollout,
                group_size=1,
                seed=0,
                stage="warm",  # not step 0's ids (its seed is 0 too)
                writer=EpisodeWriter(run_dir / "warm_start", 0),
                done=done,
                on_episode=None if progress is None else progress.advance,
                score=reward,
                backend=backend,
            )
        )
    )
    episodes = [g[0] for g in groups]
    kept = [e for e in episodes if gradient_eligible(e) and e.reward and e.reward.succeeded]
    if not kept:
        raise RuntimeError(
            f"warm start: the reference agent succeeded on none of {len(episodes)} tasks; "
            "check the environment's check_script with `tracerl check-env`"
        )
    result = sft(
        bundle.model,
        [t for e in kept for t in e.trajectories],
        lr=lr,
        epochs=epochs,
        micro_batch_tokens=micro_batch_tokens,
        progress=progress,
    )
    return {
        "warm_start/episodes": float(len(episodes)),
        "warm_start/kept": float(len(kept)),
        "warm_start/nll_before": result.nll_before,
        "warm_start/nll_after": result.nll_after,
        "time/warm_start_s": time.perf_counter() - t0,
    }


def warm_start_stage(
    cfg: RunConfig,
    bundle: Any,
    env: Any,
    probe: Any,
    policy: Policy,
    reward: Any,
    sink: MetricsLog,
    bars: QuietProgress,
    backend: RolloutBackend | None = None,
    publish: Callable[[], None] | None = None,
    micro_batch_tokens: int | None = None,
) -> dict[str, float]:
    """The run's warm-start stage: SFT on the reference agent (see `warm_start`), logged; its
    metrics. The loop then checkpoints and runs the evaluation RL must beat (stage
    ``warm_start``). `publish` gives a sampling engine that does not share the learner's
    weights (a server) the fine-tuned ones. `micro_batch_tokens`: the run's
    (``trainer.micro_batch_tokens`` with ``auto`` resolved; None: the config's number)."""
    ws, run_dir = cfg.warm_start, cfg.run_dir
    assert ws is not None
    tasks = probe.sample_tasks(ws.tasks, seed=ws.seed, split=cfg.env.train_split)
    m = warm_start(
        bundle,
        env,
        probe,
        policy.parser,
        reward,
        cfg.rollout,
        run_dir,
        tasks=tasks,
        lr=ws.lr,
        epochs=ws.epochs,
        micro_batch_tokens=micro_batch_tokens or int(cfg.trainer.micro_batch_tokens),
        done=done_episodes(run_dir / "warm_start", 0),
        progress=bars,
        # an agent's episodes are its harness's conversations: the reference plays through
        # it; tracerl's own runner (in process or on Ray workers) renders them itself
        backend=backend if getattr(backend, "harness", False) else None,
    )
    sink.log({"step": 0, "phase": "warm_start", **m})
    bars.line(
        f"warm start: SFT on {m['warm_start/kept']:.0f} reference episodes, NLL "
        f"{m['warm_start/nll_before']:.3f} before -> {m['warm_start/nll_after']:.3f} after, "
        f"{m['time/warm_start_s']:.1f} s"
    )
    policy.sampler.policy_version += 1  # the fine-tuned weights: a new version, evaluated
    if publish is not None:
        publish()
    return m
