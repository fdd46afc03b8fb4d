"""What a reward says, and why: named components in layers, a total, an owner.

A reward is never a bare float. Each component records its value, weight, layer and the
evidence it was computed from; a component behind a failed gate is kept (marked ``gated``,
contributing nothing) so the breakdown always shows what was and was not scored. A reward
that could not be decided (a verifier crashed, or nothing could tell) says so: it is never
a silent 0.
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
class RewardComponent:
    name: str
    layer: Layer
    value: float
    weight: float
    contribution: float  # value x weight, capped; 0 when gated or undecided
    evidence: dict[str, Any] = field(default_factory=dict)
    decided: bool = True
    gated: bool = False  # not scored: an earlier gate failed

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "layer": self.layer.value,
            "value": self.value,
            "weight": self.weight,
            "contribution": self.contribution,
            "evidence": self.evidence,
            "decided": self.decided,
            "gated": self.gated,
        }


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
