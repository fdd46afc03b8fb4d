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

A reference that succeeds on no task stops the run with `WarmStartFailed` (two lines, exit
2 from the command) naming whose failure its episodes were (the environment's, the reward's
or the reference's own) and their most common fault. Its episodes are set aside under
``warm_start/failed_<n>/`` (the report and `tracerl triage` still read them), so that
``--resume``, once the fault is fixed, plays the reference again rather than reuse them.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tracerl.config import RunConfig
from tracerl.envs.parsers import ActionParser
from tracerl.errors import UserError
from tracerl.report.progress import QuietProgress
from tracerl.report.sinks import MetricsLog
from tracerl.rollout.budget import RolloutConfig
from tracerl.rollout.episode import ScoreFn
from tracerl.rollout.groups import RolloutBackend, run_groups
from tracerl.rollout.persist import EpisodeWriter, done_episodes, step_file
from tracerl.rollout.reference import reference_policy
from tracerl.rollout.runner import Episode, Policy
from tracerl.train.futility import fault_of
from tracerl.train.interrupt import cancellable
from tracerl.train.metrics import gradient_eligible, owner
from tracerl.train.sft import sft
from tracerl.types import Attribution, StopReason


def summary_instruction(rollout: RolloutConfig) -> str | None:
    """What asks the policy for a summary, when its context compacts with policy-written
    summaries (the reference agent writes one there too); None otherwise."""
    c = rollout.context
    writes = c.policy == "compact" and c.summarizer.by == "policy"
    return c.summarizer.instruction if writes else None


class WarmStartFailed(UserError, RuntimeError):
    """The reference agent succeeded on none of the warm start's tasks: `owner` is whose
    failure most of its episodes were, `fault` their most common fault (`fault_of`)."""

    def __init__(
        self, message: str, hint: str, owner: Attribution | None = None, fault: str = ""
    ) -> None:
        super().__init__(message, hint)
        self.owner, self.fault = owner, fault


_WHOSE = {
    Attribution.ENVIRONMENT: "the environment's failure",
    Attribution.EVALUATOR: "the evaluator's failure (the reward decided nothing)",
    Attribution.POLICY: "the reference's own failure in a healthy environment",
    Attribution.UNKNOWN: "failures nobody can attribute",
}
_WHAT_TO_DO = {
    Attribution.ENVIRONMENT: (
        "the environment (or a tool server it uses) failed: fix it (`tracerl check-env "
        "--config {run}/config.yaml` runs one episode; `tracerl triage {run}` lists the "
        "faults), then continue with --resume: the reference plays again"
    ),
    Attribution.EVALUATOR: (
        "the reward could not score the reference's episodes: fix it (`tracerl triage {run}` "
        "shows why), then continue with --resume: the reference plays again"
    ),
    Attribution.POLICY: (
        "the environment's check_script does not solve its tasks under the run's reward: "
        "check it with `tracerl check-env --config {run}/config.yaml`, fix it (or the "
        "reward), then continue with --resume: the reference plays again"
    ),
    Attribution.UNKNOWN: (
        "`tracerl triage {run}` lists the reference's episodes; fix what failed, then "
        "continue with --resume: the reference plays again"
    ),
}


BUDGET_STOPS = frozenset(
    {
        StopReason.MAX_STEPS,
        StopReason.MAX_TOOL_CALLS,
        StopReason.MAX_TOKENS,
        StopReason.CONTEXT_OVERFLOW,
        StopReason.RESERVE_REACHED,
        StopReason.MARGINAL_GAIN,
    }
)
"""How a reference that plays its script to the end can still stop: its budget ran out."""
_OUT_OF_BUDGET = (
    "the reference ran out of its budget before its script ended: give it more "
    "(rollout.max_turn_tokens, rollout.budgets, rollout.reserve) and start the run again "
    "under a new name (name=...): a resume keeps the rollout settings"
)


def _episode_fault(e: Episode) -> str:
    """`fault_of(e)`, with the reward when the episode was the reference's own failure (a
    wrong answer stops as any answer does)."""
    fault = fault_of(e)
    if owner(e) is Attribution.POLICY and e.reward is not None:
        fault += f", reward {e.reward.total:g}"
    return fault


def no_success(episodes: Sequence[Episode], run_dir: Path) -> WarmStartFailed:
    """The error for a warm start whose reference succeeded on none of `episodes`: whose
    failure most were, their most common fault, and what to do about it."""
    if not episodes:
        return WarmStartFailed(
            "warm start: the environment gave no training task for the reference agent to play",
            "check the environment's train split (`tracerl check-env --config "
            f"{run_dir}/config.yaml`), or turn the warm start off (warm_start: null)",
        )
    owners = Counter(owner(e) for e in episodes)
    who, count = owners.most_common(1)[0]
    theirs = [e for e in episodes if owner(e) is who]
    fault, _ = Counter(_episode_fault(e) for e in theirs).most_common(1)[0]
    stop, _ = Counter(e.stop_reason for e in theirs).most_common(1)[0]
    budget = who is Attribution.POLICY and stop in BUDGET_STOPS
    return WarmStartFailed(
        f"warm start: the reference agent succeeded on none of {len(episodes)} tasks "
        f"({count} of {len(episodes)} were {_WHOSE[who]}: {fault})",
        (_OUT_OF_BUDGET if budget else _WHAT_TO_DO[who]).format(run=run_dir),
        who,
        fault,
    )


def set_aside(run_dir: Path) -> Path | None:
    """Move the warm start's episode file to ``warm_start/failed_<n>/`` (the first `n` free):
    kept for the report and triage, no longer reused by a resumed warm start. Its new path
    (None: nothing was written)."""
    path = step_file(run_dir / "warm_start", 0)
    if not path.exists():
        return None
    n = 1
    while (run_dir / "warm_start" / f"failed_{n}").exists():
        n += 1
    target = step_file(run_dir / "warm_start" / f"failed_{n}", 0)
    target.parent.mkdir(parents=True)
    os.replace(path, target)
    return target


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
        error = no_success(episodes, run_dir)
        set_aside(run_dir)  # a resume plays the reference again, once the fault is fixed
        raise error
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
