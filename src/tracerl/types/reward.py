"""What a reward says, and why: named components in layers, a total, an owner.

A reward is never a bare float. Each component records its value, weight, layer and the
evidence it was computed from; a component behind a failed gate is kept (marked ``gated``,
contributing nothing) so the breakdown always shows what was and was not scored. A reward
that could not be decided (a verifier crashed, or nothing could tell) says so: it is never
a silent 0.

A component scored per step (process reward: ``per: step`` in the spec) also keeps what
each environment step earned (`StepScore`): its value is their sum, its contribution theirs,
and `RewardBreakdown.step_rewards` gives each step its own reward, the part of the total
that turn-level credit pays to that step's turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from tracerl.types.episode import Attribution


class Layer(StrEnum):
    OUTCOME = "outcome"  # was the task done (exact match, F1)
    CONSTRAINT = "constraint"  # format, forbidden tools, permissions, budget overruns
    PROCESS = "process"  # verifiable process signals: valid calls, valid citations
    COST = "cost"  # mild, capped
    ATTRIBUTION = "attribution"  # labels, weight 0


@dataclass(frozen=True)
class StepScore:
    """What one environment step earned from a per-step component."""

    step: int
    value: float
    contribution: float  # its share of the component's contribution
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = {"step": self.step, "value": self.value, "contribution": self.contribution}
        return d | ({"evidence": self.evidence} if self.evidence else {})


@dataclass(frozen=True)
class RewardComponent:
    name: str
    layer: Layer
    value: float
    weight: float
    contribution: float  # value x weight, capped; 0 when gated or undecided
    evidence: dict[str, Any] = field(default_factory=dict)
    decided: bool = True
    gated: bool = False  # not scored: an earlier gate failed
    steps: tuple[StepScore, ...] | None = None
    """A per-step component's score of each step (None: scored per episode)."""

    def to_dict(self) -> dict[str, Any]:
        d = {
            "name": self.name,
            "layer": self.layer.value,
            "value": self.value,
            "weight": self.weight,
            "contribution": self.contribution,
            "evidence": self.evidence,
            "decided": self.decided,
            "gated": self.gated,
        }
        if self.steps is not None:
            d["steps"] = [s.to_dict() for s in self.steps]
        return d


@dataclass(frozen=True)
class RewardBreakdown:
    components: tuple[RewardComponent, ...]
    total: float
    attribution: Attribution
    decided: bool
    error: str | None = None  # the evaluator's exception, when it crashed

    @property
    def eligible(self) -> bool:
        """May this reward reach the policy gradient? Not when the evaluator failed or could
        not decide, and not when the episode was the environment's (unless it succeeded)."""
        if not self.decided or self.attribution in (Attribution.EVALUATOR, Attribution.UNKNOWN):
            return False
        return self.attribution is Attribution.POLICY or self.succeeded

    @property
    def succeeded(self) -> bool:
        outcome = [c for c in self.components if c.layer is Layer.OUTCOME and not c.gated]
        return bool(outcome) and all(c.decided and c.value >= 1.0 for c in outcome[:1])

    def component(self, name: str) -> RewardComponent:
        for c in self.components:
            if c.name == name:
                return c
        raise KeyError(f"no reward component {name!r}; have {[c.name for c in self.components]}")

    def judged(self) -> list[RewardComponent]:
        """The components a model judge scored, or failed to (their evidence names the
        ``judge``: `tracerl.rewards.judge`); gated ones were never asked."""
        return [c for c in self.components if not c.gated and "judge" in (c.evidence or {})]

    def step_rewards(self) -> dict[int, float]:
        """Each step's own reward: the sum of the per-step components' contributions to it
        (steps no per-step component scored are absent). The rest of the total is the
        episode's outcome part."""
        return {k: sum(by.values()) for k, by in self.step_components().items()}

    def step_components(self) -> dict[int, dict[str, float]]:
        """Per step: each per-step component's contribution to it, by component name."""
        out: dict[int, dict[str, float]] = {}
        for c in self.components:
            for s in c.steps or ():
                out.setdefault(s.step, {})[c.name] = s.contribution
        return out

    def metrics(self) -> dict[str, float]:
        """``reward/<component>`` per scored component, and ``reward/total``."""
        m = {f"reward/{c.name}": c.value for c in self.components if not c.gated and c.decided}
        m["reward/total"] = self.total
        return m

    @classmethod
    def scalar(cls, value: float, attribution: Attribution) -> RewardBreakdown:
        """A plain number from a user's reward function, as one outcome component
        (``reward``): it counts as success at 1.0 or more."""
        c = RewardComponent("reward", Layer.OUTCOME, float(value), 1.0, float(value))
        return cls((c,), float(value), attribution, True)

    @classmethod
    def crashed(cls, error: str) -> RewardBreakdown:
        """A reward function that raised: the evaluator's fault, undecided, never a 0."""
        c = RewardComponent("reward", Layer.OUTCOME, 0.0, 1.0, 0.0, {"error": error}, False)
        return cls((c,), 0.0, Attribution.EVALUATOR, False, error)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RewardBreakdown:
        """What `to_dict` wrote (``eligible`` is derived again, not read)."""
        comps = tuple(
            RewardComponent(
                c["name"],
                Layer(c["layer"]),
                c["value"],
                c["weight"],
                c["contribution"],
                c.get("evidence") or {},
                c.get("decided", True),
                c.get("gated", False),
                None
                if c.get("steps") is None
                else tuple(
                    StepScore(x["step"], x["value"], x["contribution"], x.get("evidence") or {})
                    for x in c["steps"]
                ),
            )
            for c in d["components"]
        )
        return cls(comps, d["total"], Attribution(d["attribution"]), d["decided"], d.get("error"))

    def to_dict(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "attribution": self.attribution.value,
            "decided": self.decided,
            "eligible": self.eligible,
            "error": self.error,
            "components": [c.to_dict() for c in self.components],
        }
