"""What the runner hands back: the policy it runs, finished episodes and their receipts."""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tracerl.envs.base import StepResult
from tracerl.envs.parsers import ActionParser, parser_for_model
from tracerl.rollout.sampler import Sampler
from tracerl.types import Attribution, Receipt, RewardBreakdown, StopReason, Trajectory


@dataclass
class Policy:
    """The policy as the runner sees it: a sampler, the chat renderer, the action parser."""

    sampler: Sampler
    renderer: Any  # tracerl.models.ChatRenderer
    parser: ActionParser
    model_id: str
    """The model's load spec ('smollm2-135m-instruct', 'tiny-random', 'hf:...'): replay
    loads the same tokenizer and template from it."""

    @classmethod
    def from_bundle(cls, bundle: Any, sampler: Sampler, parser: ActionParser | None = None):
        return cls(sampler, bundle.renderer, parser or parser_for_model(bundle.spec), bundle.spec)


@dataclass
class Episode:
    """A finished episode: its trajectories (with steps, receipt) and how it ended."""

    trajectories: list[Trajectory]
    receipt: Receipt
    stop_reason: StopReason
    attribution: Attribution
    gradient_eligible: bool
    steps: list[dict[str, Any]] = field(default_factory=list)
    reward: RewardBreakdown | None = None
    """Set by `score_episode` (the run's reward), and written with the trajectories."""

    @property
    def episode_id(self) -> str:
        return self.receipt.episode_id


ScoreFn = Callable[[Episode], "float | RewardBreakdown"]
"""A reward function: a `RewardBreakdown` (named components), or a plain number."""


def score_episode(episode: Episode, score: ScoreFn) -> Episode:
    """Score `episode` and attach the breakdown to it and to each of its trajectories (so
    the run directory keeps it). A plain number becomes a one-component breakdown; a
    function that raises is the evaluator's fault: undecided, never a silent 0."""
    try:
        value = score(episode)
    except Exception as e:
        reward = RewardBreakdown.crashed(f"{type(e).__name__}: {e}")
    else:
        reward = (
            value
            if isinstance(value, RewardBreakdown)
            else RewardBreakdown.scalar(value, episode.attribution)
        )
    episode.reward = reward
    d = reward.to_dict()
    per_step = reward.step_components()

    def mark(steps: Any) -> tuple[dict[str, Any], ...]:
        """Each step record with its own reward (``step_reward``, and by component in
        ``step_rewards``) when per-step components scored it."""
        return tuple(
            {**s, "step_reward": sum(by.values()), "step_rewards": by}
            if (by := per_step.get(s.get("step"))) is not None
            else s
            for s in steps
        )

    episode.trajectories = [
        # a sub-agent's steps are numbered its own way: the episode's step rewards are not its
        dataclasses.replace(
            t, reward=d, steps=mark(t.steps) if per_step and not t.agent else t.steps
        )
        for t in episode.trajectories
    ]
    if per_step:
        episode.steps = list(mark(episode.steps))
    return episode


def episode_seed(seed: int, *parts: Any) -> int:
    """A stable 63-bit seed derived from a base seed and labels (task id, member index...)."""
    digest = hashlib.sha256(":".join(map(str, (seed, *parts))).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def finish_episode(run: Any, stop: StopReason) -> Episode:
    """The finished episode of a runner's per-episode state `run`: whose it is (the
    environment's if the environment failed it or it ran out of wall time, then the
    evaluator's, then unknown, else the policy's), its receipt, its trajectories."""
    # Wall time measures the machine (env latency, sampler queues) as much as the policy:
    # a timeout is never the policy's signal. Budget its effort with steps and tokens.
    if stop is StopReason.TIMEOUT or (stop is StopReason.INFRA_FAILURE and not run.unknown_fault):
        run.env_fault = True
    if run.env_fault:
        attribution = Attribution.ENVIRONMENT
    elif run.eval_fault:
        attribution = Attribution.EVALUATOR
    elif run.unknown_fault:
        attribution = Attribution.UNKNOWN
    else:
        attribution = Attribution.POLICY
    samples = run.conv.samples() if run.conv is not None else [Trajectory(segments=())]
    sampled = sum(len(s.token_ids) for t in samples for s in t.policy_segments())
    eligible = attribution is Attribution.POLICY and sampled > 0
    receipt = build_receipt(run, stop, attribution, eligible)
    receipt_dict = receipt.to_dict()  # one per episode, its trajectories' (as a Ray worker's stamp)
    trajectories = [
        dataclasses.replace(
            t,
            steps=tuple({**s, **run.records.get(s["step"], {})} for s in t.steps),
            receipt=receipt_dict,
            episode_id=run.episode_id,
            agent=getattr(run, "agent", ""),
            _cache={},
        )
        for t in samples
    ]
    steps = [dict(s) for t in trajectories for s in t.steps]
    # a sub-agent's samples are the episode's too, after its own (their receipts are theirs)
    for child in getattr(getattr(run, "delegation", None), "children", ()):
        for t in child.trajectories:
            trajectories.append(
                dataclasses.replace(
                    t, episode_id=run.episode_id, sample_index=len(trajectories), _cache={}
                )
            )
    return Episode(trajectories, receipt, stop, attribution, eligible, steps)


def build_receipt(run: Any, stop: StopReason, attribution: Attribution, eligible: bool) -> Receipt:
    """The receipt of a finished episode run (`run` is the runner's per-episode state)."""
    env_spec = dict(getattr(run.env, "spec", None) or {"name": run.env.name, "kwargs": {}})
    describe = getattr(run.env, "describe", None)
    services = run.env.services()
    return Receipt(
        replay_id=run.replay_id,
        episode_id=run.episode_id,
        env={
            **env_spec,
            "version": run.env.version,
            "wrappers": [describe()] if describe else [],
            **({"services": services} if services else {}),
        },
        tool_versions=run.env.tool_versions(),
        tool_schemas=[t.receipt_schema() for t in run.env.tools],
        tools_in_prompt=bool(run.env.tool_schemas()),
        task_id=str(run.task.get("id")),
        task=run.task,
        seed=run.seed,
        policy_version=getattr(run.policy.sampler, "policy_version", None),
        model_id=run.policy.model_id,
        template_hash=run.policy.renderer.template_hash,
        template_kwargs=dict(run.conv.template_kwargs) if run.conv else {},
        parser=run.policy.parser.name,
        side_effect_guard=run.env.side_effect_guard,
        rollout=run.cfg.model_dump(),
        reset_messages=run.reset_messages,
        error=run.error,
        final_state=getattr(run, "final_state", None),
        steps=[
            {"step": k, "latency_ms": r.get("latency_ms", 0.0), "exception": r.get("exception")}
            for k, r in sorted(run.records.items())
        ],
        ledger=run.ledger.to_dict(stop.value, run.env.side_effect_guard),
        compactions=list(run.context.records) if hasattr(run, "context") else [],
        children=list(run.delegation.records) if hasattr(run, "delegation") else [],
        parent=getattr(run, "parent", None),
        stop_reason=stop.value,
        attribution=attribution.value,
        gradient_eligible=eligible,
        started_at=run.started_at,
        wall_time_s=round(time.perf_counter() - run.t0, 4),
    )


def result_record(result: StepResult) -> dict[str, Any]:
    """An env result as recorded (before the runner touches it): what exact replay feeds."""
    return {
        "messages": [dict(m) for m in result.messages],
        "terminated": result.terminated,
        "truncated": result.truncated,
        "info": result.info,
        "calls": [c.to_record() for c in result.calls],
        "evidence_gain": result.evidence_gain,
    }


def episode_from_trajectories(trajectories: list[Trajectory]) -> Episode:
    """An episode read back from the run directory (all its samples, in order)."""
    trajectories = sorted(trajectories, key=lambda t: t.sample_index)
    receipt = Receipt.from_dict(trajectories[0].receipt)
    steps = [dict(s) for t in trajectories if not t.agent for s in t.steps]
    reward = trajectories[0].reward
    return Episode(
        trajectories,
        receipt,
        StopReason(receipt.stop_reason),
        Attribution(receipt.attribution),
        receipt.gradient_eligible,
        steps,
        RewardBreakdown.from_dict(reward) if reward else None,
    )
