"""Layered rewards, composed from a small YAML spec.

    components:
      - {name: format, fn: answered, layer: constraint, weight: 0.0, gate: 1.0}
      - {name: em, fn: exact_match, layer: outcome, weight: 1.0, gate: 1.0}
      - {name: citations, fn: citations_valid, layer: process, weight: 0.3}
      - {name: search_cost, fn: search_cost, layer: cost, weight: 1.0, cap: 0.1,
         params: {per_search: 0.02}}

Components are scored in order. A component with a ``gate`` closes the gate when its value
is below it: every later component is kept but not scored (``gated``), so credit for process
signals cannot be earned without the outcome they serve. ``cap`` bounds the magnitude of a
component's contribution (cost may never outweigh finishing the task).

A component is scored once per episode (``per: episode``, the default: outcomes,
constraints, anything about the whole) or once per environment step (``per: step``:
process rewards such as the evidence a search gained or a malformed call). A per-step
function sees the step as ``ctx.step``; the component's value is the sum over steps, its
contribution the sum of theirs (a cap bounds the sum, and scales every step's share alike),
and each step's share is recorded (`tracerl.types.StepScore`) so turn-level credit can pay
it to the turn that earned it. A gate is an episode's verdict: it cannot be per step.

A component function raising is an evaluator error: the breakdown is attributed to the
evaluator, undecided, and ineligible for the gradient. It never scores 0 silently.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from tracerl.types import (
    Attribution,
    Layer,
    RewardBreakdown,
    RewardComponent,
    StepScore,
    Trajectory,
)


@dataclass(frozen=True)
class Score:
    value: float
    evidence: dict[str, Any] = field(default_factory=dict)
    decided: bool = True


@dataclass
class RewardContext:
    """What a reward component may look at: the task, the final answer, the step records,
    how the episode ended and whose it was, and a document lookup for citations."""

    task: dict[str, Any]
    answer: dict[str, Any] | None
    steps: list[dict[str, Any]]
    stop_reason: str
    attribution: Attribution
    lookup: Callable[[str], str | None] = lambda _: None
    ledger: dict[str, Any] = field(default_factory=dict)
    trajectories: Sequence[Trajectory] = ()
    """The episode's samples (token ids, masks, segments with their text)."""
    step: dict[str, Any] | None = None
    """For a per-step component: the step being scored (one of `steps`); None otherwise."""
    policy_version: int | None = None
    """The version of the policy that sampled the episode (a judge's budget is per step)."""
    group: Sequence[RewardContext] | None = None
    """When the reward scores a whole group at once (a group-relative judge): the contexts
    of every member, this one among them; None when episodes are scored one by one."""
    phase: str = "train"
    """``train``, or ``eval`` when an evaluation scores the episode (a judge keeps the
    evaluation's spending apart from the training step's budget)."""
    judges: Any = None
    """The run's judges (`tracerl.rewards.judge.component.JudgeSet`: their memory and
    budgets are the run's); None: the process's own."""
    final_state: dict[str, Any] = field(default_factory=dict)
    """The world when the episode ended, read before the environment closed (the
    receipt's ``final_state``: for an MCP server, ``{server: {key: result text}}``)."""
    agent: dict[str, Any] = field(default_factory=dict)
    """What the agent harness of a gateway episode reported (the receipt's ``agent``: its
    ``entry``, what it ``returned`` however the episode ended, its ``exception``); empty for
    tracerl's own episodes."""

    @property
    def scoped_steps(self) -> list[dict[str, Any]]:
        """The steps a component judges: the one being scored (per step), else all."""
        return [self.step] if self.step is not None else list(self.steps)

    @property
    def answer_text(self) -> str:
        """The final answer's text ("" when the episode never answered)."""
        return str((self.answer or {}).get("text") or "")

    @property
    def last_sampled_text(self) -> str:
        """The text of the model's last sampled turn ("" when it sampled none): the reply an
        episode cut by the token limit never handed to its environment."""
        own = [t for t in self.trajectories if not t.agent]  # not a sub-agent's turn
        for trajectory in reversed(own):
            segments = trajectory.policy_segments()
            if segments:
                return segments[-1].text or ""
        return ""

    @property
    def info(self) -> dict[str, Any]:
        """The last step's ``info`` (what the environment said when the episode ended)."""
        return dict((self.steps[-1].get("info") or {}) if self.steps else {})

    @classmethod
    def from_trajectories(
        cls, trajectories: Sequence[Trajectory], lookup: Callable[[str], str | None]
    ) -> RewardContext:
        receipt = trajectories[0].receipt or {}
        own = [t for t in trajectories if not t.agent]  # a sub-agent's steps are its own
        steps = sorted(
            {s["step"]: s for t in own for s in t.steps}.values(), key=lambda s: s["step"]
        )
        answer = next(
            (
                (s.get("info") or {}).get("answer")
                for s in reversed(steps)
                if (s.get("info") or {}).get("answer") is not None
            ),
            None,
        )
        if answer is not None and not isinstance(answer, dict):  # a bare final answer
            answer = {"text": str(answer)}
        return cls(
            task=receipt.get("task", {}),
            answer=answer,
            steps=steps,
            stop_reason=receipt.get("stop_reason", ""),
            attribution=Attribution(receipt.get("attribution", "unknown")),
            lookup=lookup,
            ledger=receipt.get("ledger", {}),
            trajectories=tuple(trajectories),
            final_state=receipt.get("final_state") or {},
            policy_version=receipt.get("policy_version"),
            agent=receipt.get("agent") or {},
        )


ComponentFn = Callable[..., Score]
COMPONENTS: dict[str, ComponentFn] = {}
PER_STEP: set[str] = set()
"""Registered components that may be scored per step (``per: step``)."""


def component(name: str, *, per_step: bool = False) -> Callable[[ComponentFn], ComponentFn]:
    """Register a reward component function ``fn(ctx, **params) -> Score`` by name.
    `per_step`: it also judges one step (``ctx.step``) in a way that sums to the
    episode's (a gain, a cost, a penalty); a share or a verdict about the episode does not."""

    def register(fn: ComponentFn) -> ComponentFn:
        if name in COMPONENTS:
            raise ValueError(f"reward component {name!r} is already registered")
        COMPONENTS[name] = fn
        if per_step:
            PER_STEP.add(name)
        return fn

    return register


def per_step_problem(c: ComponentSpec) -> str | None:
    """Why registered component `c` cannot be scored per step (None: it can, or it is not
    per step, or not a registered component: a user's function decides for itself)."""
    if c.per != "step" or c.fn not in COMPONENTS or c.fn in PER_STEP:
        return None
    return (
        f"component {c.name!r}: {c.fn} judges the whole episode and cannot be scored per "
        f"step (summed over steps it would pay for taking more of them); per step: "
        f"{', '.join(sorted(PER_STEP))}, or a function of your own that takes `step`"
    )


class ComponentSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    name: str
    """The metric name (``reward/<name>``)."""
    fn: str
    """The function that scores it: a registered component, a method of the environment,
    or an import path (``package.module:function``)."""
    layer: Layer
    """What it measures: ``outcome`` (was the task done; the first one scored decides
    success), ``constraint`` (format, permissions, budget; below 1 counts as a violation),
    ``process``, ``cost`` or ``attribution`` (labels). The layer shapes reports and success,
    not the total."""
    weight: float = Field(1.0, allow_inf_nan=False)
    """The component adds value x weight to the total reward (0: scored and reported, or a
    gate, but worth nothing)."""
    gate: float | None = Field(None, allow_inf_nan=False)
    """If set: later components are scored only if this value is at least the gate."""
    cap: float | None = Field(None, ge=0, allow_inf_nan=False)
    """Bound on |value x weight|."""
    params: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments for the function: ``fn(ctx, **params)``."""
    per: Literal["episode", "step"] = "episode"
    """``episode``: scored once, on the whole episode. ``step``: scored on every
    environment step (``ctx.step``), a process reward each step earns on its own; turn-level
    credit (``trainer.credit``) pays it to that step's turn. Its value is the steps' sum."""

    @model_validator(mode="after")
    def _per_step_is_process(self) -> ComponentSpec:
        if self.per == "step" and self.gate is not None:
            raise ValueError(
                f"component {self.name!r}: a gate decides the whole episode, so it cannot be "
                "scored per step; drop gate, or use per: episode"
            )
        if self.per == "step" and self.layer is Layer.OUTCOME:
            raise ValueError(
                f"component {self.name!r}: an outcome (was the task done) is the episode's; "
                "score it per: episode, or give the per-step signal layer: process or cost"
            )
        return self


class RewardSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    components: list[ComponentSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _names_and_an_outcome(self) -> RewardSpec:
        names = [c.name for c in self.components]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"component names must differ (reward/<name> metrics): {twice}")
        if not any(c.layer is Layer.OUTCOME for c in self.components):
            raise ValueError(
                "no component has layer: outcome; mark the one that says the task was done "
                "(success is its value reaching 1.0)"
            )
        return self

    @classmethod
    def from_yaml(cls, source: str | Path) -> RewardSpec:
        """From a YAML file path or YAML text; errors name the offending field."""
        text = Path(source).read_text() if isinstance(source, Path) else source
        spec = cls.model_validate(yaml.safe_load(text))
        unknown = [c.fn for c in spec.components if c.fn not in COMPONENTS]
        if unknown:
            raise ValueError(
                f"reward spec: unknown component functions {unknown}; registered: "
                f"{', '.join(sorted(COMPONENTS))}"
            )
        for c in spec.components:
            if (problem := per_step_problem(c)) is not None:
                raise ValueError(f"reward spec: {problem}")
        return spec


def compose(
    spec: RewardSpec, ctx: RewardContext, functions: dict[str, ComponentFn] | None = None
) -> RewardBreakdown:
    """Score every component in order, honouring gates and caps. `functions` maps a
    component's ``fn`` to the function (`tracerl.rewards.resolve`); default: the registered
    components."""
    functions = COMPONENTS if functions is None else functions
    out: list[RewardComponent] = []
    gate_open, decided = True, True
    for c in spec.components:
        if not gate_open:
            out.append(RewardComponent(c.name, c.layer, 0.0, c.weight, 0.0, gated=True))
            continue
        try:
            score, steps = _score(c, ctx, functions[c.fn])
        except Exception as e:  # the evaluator's fault, never the policy's
            where, e = (f" (step {e.step})", e.error) if isinstance(e, _StepFailed) else ("", e)
            error = f"{c.name}{where}: {type(e).__name__}: {e}"
            # what the failure knows of itself (a judge: its attempts and what they cost)
            known = getattr(e, "evidence", None)
            evidence = {**(known if isinstance(known, dict) else {}), "error": error}
            failed = RewardComponent(c.name, c.layer, 0.0, c.weight, 0.0, evidence, decided=False)
            rest = [
                RewardComponent(x.name, x.layer, 0.0, x.weight, 0.0, gated=True)
                for x in spec.components[len(out) + 1 :]
            ]
            # every component stays listed, so readers of the breakdown never miss a name
            return RewardBreakdown((*out, failed, *rest), 0.0, Attribution.EVALUATOR, False, error)
        out.append(_weigh(c, score, steps))
        decided = decided and score.decided
        if c.gate is not None and (not score.decided or score.value < c.gate):
            gate_open = False
    total = sum(x.contribution for x in out)
    return RewardBreakdown(tuple(out), total, ctx.attribution, decided)


class _StepFailed(Exception):
    def __init__(self, step: Any, error: Exception) -> None:
        super().__init__(step, error)
        self.step, self.error = step, error


def _checked(score: Any) -> Score:
    if not isinstance(score, Score):
        raise TypeError(f"returned {type(score).__name__}, not a Score")
    if not math.isfinite(score.value):
        raise ValueError(f"scored {score.value} (not a finite number)")
    return score


def _score(
    c: ComponentSpec, ctx: RewardContext, fn: ComponentFn
) -> tuple[Score, list[tuple[int, Score]] | None]:
    """The component's score, and for a per-step one each step's (the value is their sum;
    one undecided step leaves the component undecided)."""
    if c.per == "episode":
        return _checked(fn(ctx, **c.params)), None
    steps = []
    for record in ctx.steps:
        try:
            score = _checked(fn(dataclasses.replace(ctx, step=record), **c.params))
        except Exception as e:
            raise _StepFailed(record.get("step"), e) from e
        steps.append((int(record.get("step", len(steps))), score))
    total = Score(
        sum(s.value for _, s in steps),
        {"steps": len(steps)},
        all(s.decided for _, s in steps),
    )
    return total, steps


def _weigh(
    c: ComponentSpec, score: Score, steps: list[tuple[int, Score]] | None
) -> RewardComponent:
    """value x weight, capped (for a per-step component: the sum of the steps' shares,
    each scaled alike when the cap bites); 0 when undecided."""
    raw = score.value * c.weight if score.decided else 0.0
    contribution = raw if c.cap is None else max(-c.cap, min(c.cap, raw))
    per_step = None
    if steps is not None:
        # the cap's scaling, alike for every step (1 when it did not bite: steps whose
        # shares cancel out keep them)
        scale = 1.0 if contribution == raw else contribution / raw
        per_step = tuple(
            StepScore(k, s.value, s.value * c.weight * scale if score.decided else 0.0, s.evidence)
            for k, s in steps
        )
    return RewardComponent(
        c.name,
        c.layer,
        score.value,
        c.weight,
        contribution,
        score.evidence,
        score.decided,
        steps=per_step,
    )
