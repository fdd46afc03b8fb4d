"""Triage: whose failure each episode is, and of which kind.

When training does not improve, the next decision should rest on what the episodes did,
not on the reward curve. Every episode falls in exactly one bucket:

    succeeded      the outcome was reached
    policy         a healthy environment, a decided reward, and the policy failed:
                   wrong_tool       called a tool that does not exist, is forbidden, or with
                                    invalid arguments
                   format           turns the parser could not read until the episode
                                    ended, or no final answer in the expected form
                   answered_without_evidence
                                    answered before any observation held the answer (it
                                    stopped looking too soon, or its searches missed)
                   ignored_evidence an observation held the answer, the final answer did not
                   out_of_budget    a budget ended the episode before an answer
                   constraint_violated
                                    a constraint-layer reward component failed (forbidden
                                    edits, a format of one's own): named, with its evidence
                   wrong_answer     an outcome component failed and no gold answer can be
                                    looked for: named, with its evidence
                   unscored         the policy's rollout, but nothing scored it (a run with
                                    no reward, as `tracerl demo`)
    environment    an outage or degraded service shaped the episode (never the policy's)
    evaluator      the reward code crashed, or nothing could decide (undecided near miss,
                   unknown attribution, an unscored rollout of unknown owner)

The policy kinds are the design notes' "selected a tool without permission, ignored
necessary evidence or stopped too early", plus format, budget and the honest remainder.
The evidence kinds need gold answers (the task's ``answers``, or the ``golds`` a failed
outcome component recorded, as the search reward's exact match does); an environment that
brings its own reward is described by the components that reward recorded instead.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass

from tracerl.report.run import EpisodeRecord, as_strings
from tracerl.types import Layer, RewardComponent, Source

BUCKETS = ("succeeded", "policy", "environment", "evaluator")
POLICY_KINDS = (
    "wrong_tool",
    "format",
    "answered_without_evidence",
    "ignored_evidence",
    "out_of_budget",
    "constraint_violated",
    "wrong_answer",
    "unscored",
)
_TOOL_FAULTS = {"unknown_tool", "forbidden_tool", "invalid_arguments"}
_BUDGET_STOPS = {
    "max_steps",
    "max_tool_calls",
    "max_tokens",
    "context_overflow",
    "marginal_evidence_gain_below_threshold",
    "reserve_reached",
}
_FINISHED = {"answered", "env_terminated"}  # the agent answered, or the task reached an end


@dataclass(frozen=True)
class Verdict:
    bucket: str
    kind: str
    why: str


def _norm(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.casefold()).split())


def _faults(ep: EpisodeRecord) -> list[str]:
    """Every fault kind the episode's steps recorded (tool calls and parse errors)."""
    out = []
    for s in ep.steps:
        if s.get("fault"):
            out.append(str(s["fault"].get("kind")))
        calls = list(s.get("calls") or [])
        for attempt in s.get("attempts") or []:  # a step that kept failing has no "calls"
            calls += [] if s.get("calls") else attempt.get("calls") or []
        for c in calls:
            status = (c.get("observation") or {}).get("status", "ok")
            if status != "ok":
                out.append(str(status))
    return out


def _evidence_seen(ep: EpisodeRecord, golds: list[str]) -> bool:
    observed = _norm(
        " ".join(
            s.text or ""
            for t in ep.trajectories
            for s in t.segments
            if s.source is Source.ENVIRONMENT
        )
    )
    return any(_norm(g) and f" {_norm(g)} " in f" {observed} " for g in golds)


def classify(ep: EpisodeRecord) -> Verdict:
    r = ep.reward
    faults = _faults(ep)
    if ep.attribution == "environment":
        infra = [f for f in faults if f not in _TOOL_FAULTS and f != "parse_error"]
        kind = infra[0] if infra else ep.stop_reason or "environment"
        if ep.stop_reason == "agent_error":  # the harness (gateway episodes) failed
            why = ep.receipt.get("error") or "the agent failed"
            return Verdict("environment", "agent_error", f"the agent harness failed: {why}")
        return Verdict(
            "environment",
            kind,
            f"environment-attributed ({', '.join(dict.fromkeys(infra)) or kind})",
        )
    if r is None:  # nothing scored it (`tracerl demo` scores none): the rollout's owner's
        owner = "policy" if ep.attribution == "policy" else "evaluator"
        return Verdict(owner, "unscored", "no reward was computed for this episode")
    if r.error is not None or ep.attribution == "evaluator":
        return Verdict("evaluator", "evaluator_crashed", r.error or "evaluator-attributed")
    if ep.attribution == "unknown":
        return Verdict(
            "evaluator", "unknown", "nobody could tell whose fault (unknown attribution)"
        )
    if not r.decided:
        undecided = [c.name for c in r.components if not c.decided]
        return Verdict("evaluator", "undecided", f"undecided: {', '.join(undecided)}")
    if r.succeeded:
        return Verdict("succeeded", "succeeded", f"reward {r.total:.3f}")
    return Verdict("policy", *_policy_kind(ep, faults))


def _policy_kind(ep: EpisodeRecord, faults: list[str]) -> tuple[str, str]:
    tool = [f for f in faults if f in _TOOL_FAULTS]
    if tool:
        return "wrong_tool", f"tool faults: {', '.join(sorted(set(tool)))}"
    unreadable = faults.count("parse_error")
    if ep.stop_reason == "parse_error_limit":
        return "format", f"{unreadable} unreadable turn(s), no answer"
    if ep.stop_reason in _BUDGET_STOPS:
        return "out_of_budget", f"stopped by {ep.stop_reason} before answering"
    if ep.stop_reason == "agent_error":  # the harness crashed on the model's answer
        raised = (ep.receipt.get("agent") or {}).get("exception")
        return "agent_crash", f"the agent could not use the model's answer: {raised}"
    if ep.stop_reason not in _FINISHED:
        return "format", f"ended with {ep.stop_reason or 'no stop reason'}, not an answer"
    # it answered (or the environment reached an end state), wrongly: say why in the terms of
    # the reward the run used (unreadable turns on the way are noted, but they are not the
    # failure)
    also = f" ({unreadable} unreadable turn(s) on the way)" if unreadable else ""
    r = ep.reward
    components = r.components if r is not None else ()
    outcome = next(
        (
            c
            for c in components
            if c.layer is Layer.OUTCOME and not c.gated and c.decided and c.value < 1.0
        ),
        None,
    )
    golds = (
        as_strings((outcome.evidence or {}).get("golds")) if outcome else []
    ) or ep.gold_answers
    observed = bool(ep.receipt.get("tool_schemas")) or any(  # no tools, no observation:
        s.source is Source.ENVIRONMENT for t in ep.trajectories for s in t.segments
    )  # no evidence it could have looked for
    if golds and observed and ep.stop_reason == "answered":  # was the answer in front of it?
        if _evidence_seen(ep, golds):
            return "ignored_evidence", f"an observation held {golds[0]!r}; the answer did not{also}"
        return (
            "answered_without_evidence",
            f"answered before any observation held {golds[0]!r}{also}",
        )
    broken = [
        c
        for c in components
        if c.layer is Layer.CONSTRAINT and not c.gated and c.decided and c.value < 1.0
    ]
    if outcome is not None:
        more = f"; constraint {broken[0].name} failed too" if broken else ""
        return "wrong_answer", f"outcome {describe(outcome)}{more}{also}"
    if broken:
        return "constraint_violated", f"constraint {describe(broken[0])}{also}"
    gated = next((i for i, c in enumerate(components) if c.gated), 0)
    if gated:  # a gate closed before the outcome was scored: the component just before it
        return "wrong_answer", f"{describe(components[gated - 1])} closed the gate{also}"
    return "wrong_answer", f"no outcome component reached 1.0{also}"


def describe(c: RewardComponent, pairs: int = 3, width: int = 40) -> str:
    """A component in a line: its name, its value and the first few items of its evidence,
    each value cut to about `width` characters (``within_tolerance 0.000 (answer='12',
    expected=1200)``)."""
    items = list((c.evidence or {}).items())
    shown = [f"{k}={_brief(v, width)}" for k, v in items[:pairs]]
    if len(items) > pairs:
        shown.append("...")
    return f"{c.name} {c.value:.3f}" + (f" ({', '.join(shown)})" if shown else "")


def _brief(value: object, width: int) -> str:
    if isinstance(value, str):
        text = " ".join(value.split())
        return repr(text if len(text) <= width else text[: width - 3] + "...")
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, bool | int) or value is None:
        return str(value)
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= width else text[: width - 3] + "..."


@dataclass
class Triage:
    episodes: list[EpisodeRecord]
    verdicts: list[Verdict]

    def counts(self) -> Counter[str]:
        return Counter(v.bucket for v in self.verdicts)

    def kinds(self, bucket: str) -> Counter[str]:
        return Counter(v.kind for v in self.verdicts if v.bucket == bucket)

    def examples(self, bucket: str, kind: str, k: int = 3) -> list[tuple[EpisodeRecord, Verdict]]:
        pairs = zip(self.episodes, self.verdicts, strict=True)
        return [(e, v) for e, v in pairs if v.bucket == bucket and v.kind == kind][:k]


def triage(episodes: list[EpisodeRecord], n: int | None = 100) -> Triage:
    """Classify the last `n` training episodes (all episodes when the run has no training
    episodes, e.g. an evaluation-only run); `n=None` takes them all."""
    pool = [e for e in episodes if e.phase == "train"] or list(episodes)
    if n is not None:
        pool = pool[-n:]
    return Triage(pool, [classify(e) for e in pool])
