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
                   wrong_answer     none of the above can be told (the task has no gold
                                    answer to look for)
    environment    an outage or degraded service shaped the episode (never the policy's)
    evaluator      the reward code crashed, or nothing could decide (undecided near miss,
                   unknown attribution, an unscored episode)

The policy kinds are the design notes' "selected a tool without permission, ignored
necessary evidence or stopped too early", plus format, budget and the honest remainder.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from tracerl.report.run import EpisodeRecord
from tracerl.types import Source

BUCKETS = ("succeeded", "policy", "environment", "evaluator")
POLICY_KINDS = (
    "wrong_tool",
    "format",
    "answered_without_evidence",
    "ignored_evidence",
    "out_of_budget",
    "wrong_answer",
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
        return Verdict(
            "environment",
            kind,
            f"environment-attributed ({', '.join(dict.fromkeys(infra)) or kind})",
        )
    if r is None:
        return Verdict("evaluator", "unscored", "no reward was recorded for this episode")
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
    if ep.stop_reason != "answered":
        return "format", f"ended with {ep.stop_reason or 'no stop reason'}, not an answer"
    # it answered, wrongly: was the answer in front of it? (unreadable turns on the way are
    # noted, but the wrong answer is the failure)
    also = f" ({unreadable} unreadable turn(s) on the way)" if unreadable else ""
    golds = [str(g) for g in (ep.receipt.get("task") or {}).get("answers") or []]
    if not golds:
        return "wrong_answer", "wrong answer (the task has no gold answer to look for)" + also
    if _evidence_seen(ep, golds):
        return "ignored_evidence", f"an observation held {golds[0]!r}; the answer did not{also}"
    return "answered_without_evidence", f"answered before any observation held {golds[0]!r}{also}"


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
