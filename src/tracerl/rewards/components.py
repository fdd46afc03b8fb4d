"""Reward components for question answering with tools (registered by name)."""

from __future__ import annotations

from typing import Any

from tracerl.rewards.compose import RewardContext, Score, component
from tracerl.rewards.qa import exact_match, f1, normalize, sub_exact_match, verify_citation


def _text(ctx: RewardContext) -> str:
    return str((ctx.answer or {}).get("text") or "")


@component("answered")
def answered(ctx: RewardContext) -> Score:
    """Constraint: the episode ended with an answer in the expected format."""
    ok = ctx.stop_reason == "answered" and ctx.answer is not None
    return Score(float(ok), {"stop_reason": ctx.stop_reason})


@component("exact_match")
def em(ctx: RewardContext, review_f1: float | None = 0.5) -> Score:
    """Outcome: exact match. A near miss (no exact match, but token F1 of at least
    `review_f1`, e.g. "Paris, France" for "Paris") is left undecided: a person decides it
    in the review pool, the rule does not guess."""
    text, golds = _text(ctx), ctx.task["answers"]
    value = exact_match(text, golds)
    evidence = {"answer": text, "golds": list(golds)}
    if value == 0.0 and review_f1 is not None and text and not _hedged(text):
        close, precision = f1(text, golds), _precision(text, golds)
        if close >= review_f1 and precision >= 0.5:
            evidence.update(f1=close, precision=precision, review="near miss")
            return Score(0.0, evidence, decided=False)
    return Score(value, evidence)


def _hedged(text: str) -> bool:
    """'A or B', 'A and/or B', 'A / B': a hedge is a wrong answer, not a near miss."""
    words = normalize(text).split()
    return "or" in words or "/" in text or "andor" in words


def _precision(text: str, golds: list[str]) -> float:
    p = normalize(text).split()
    return (
        max((sum(1 for w in p if w in normalize(g).split()) / len(p) for g in golds), default=0.0)
        if p
        else 0.0
    )


@component("sub_exact_match")
def sub_em(ctx: RewardContext) -> Score:
    return Score(sub_exact_match(_text(ctx), ctx.task["answers"]))


@component("f1")
def token_f1(ctx: RewardContext) -> Score:
    return Score(f1(_text(ctx), ctx.task["answers"]))


@component("citations_valid")
def citations_valid(
    ctx: RewardContext, require: bool = True, judge: dict[str, Any] | None = None
) -> Score:
    """Process: the share of citations whose chain holds (exists → quoted → supports).
    With `require`, an answer without citations scores 0. With `judge` (a judge's params,
    `tracerl.rewards.judge.component.JudgeParams`; its rubric defaults to
    ``SUPPORTS_RUBRIC``), a quote that does not mention the answer word for word supports it
    if the judge says so (a judge that fails makes the episode the evaluator's)."""
    cites = (ctx.answer or {}).get("citations") or []
    supports, judged = None, []
    if judge is not None and cites:
        from tracerl.rewards.judge.component import judged_cost, supports_judge

        supports, judged = supports_judge(judge, ctx)
    verdicts = [verify_citation(c, _text(ctx), ctx.lookup, judge=supports) for c in cites]
    if not verdicts:
        return Score(0.0 if require else 1.0, {"verdicts": []})
    evidence: dict[str, Any] = {"verdicts": verdicts}
    if judged:
        evidence.update(judged_cost(judged))
    return Score(sum(v["valid"] for v in verdicts) / len(verdicts), evidence)


def _validate_citation_judge(params: dict[str, Any], where: str) -> None:
    if params.get("judge") is not None:
        from tracerl.rewards.judge.component import SUPPORTS_RUBRIC, JudgeSet

        JudgeSet().get(params["judge"], default_rubric=SUPPORTS_RUBRIC)


citations_valid.validate = _validate_citation_judge  # type: ignore[attr-defined]


def _bad_calls(steps: list[dict]) -> tuple[int, int]:
    """(calls, malformed or refused ones) in `steps`; a turn that did not parse counts as one."""
    calls = [c for s in steps for c in s.get("calls", [])]
    parse_errors = sum(1 for s in steps if (s.get("fault") or {}).get("kind") == "parse_error")
    return len(calls) + parse_errors, sum(c["policy_error"] for c in calls) + parse_errors


@component("valid_calls")
def valid_calls(ctx: RewardContext) -> Score:
    """Process: the share of tool calls that were well-formed and permitted (per episode;
    per step, `call_errors`)."""
    n, bad = _bad_calls(ctx.steps)
    return Score(1.0 - bad / n if n else 1.0, {"calls": n, "bad": bad})


@component("call_errors", per_step=True)
def call_errors(ctx: RewardContext) -> Score:
    """Process penalty: minus the number of malformed or refused tool calls (a turn that
    did not parse counts as one); per step, that step's. Give it a small weight."""
    n, bad = _bad_calls(ctx.scoped_steps)
    return Score(-float(bad) if bad else 0.0, {"calls": n, "bad": bad})


@component("no_forbidden")
def no_forbidden(ctx: RewardContext) -> Score:
    """Constraint: no forbidden tool or action was attempted."""
    forbidden = [
        c["action"]["tool"]
        for s in ctx.steps
        for c in s.get("calls", [])
        if c["observation"]["status"] == "forbidden_tool"
    ]
    return Score(0.0 if forbidden else 1.0, {"forbidden": forbidden})


@component("search_cost", per_step=True)
def search_cost(ctx: RewardContext, per_search: float = 0.02, tool: str = "search") -> Score:
    """Cost: minus `per_search` per call of `tool` (cap it in the spec)."""
    n = sum(1 for s in ctx.scoped_steps for c in s.get("calls", []) if c["action"]["tool"] == tool)
    return Score(-per_search * n, {"searches": n})


@component("evidence_gain", per_step=True)
def evidence_gain(ctx: RewardContext) -> Score:
    """Process: the evidence the steps gained, as the environment judges it (the search
    environment: the share of the task's gold documents a step surfaced for the first time;
    a repeated or useless search gains 0). Per step, a turn's own contribution to finding
    what the answer needs; per episode, the share found in all."""
    gains = [float(s.get("evidence_gain") or 0.0) for s in ctx.scoped_steps]
    return Score(sum(gains), {"gains": gains} if ctx.step is None else {})


@component("attribution_label")
def attribution_label(ctx: RewardContext) -> Score:
    """Attribution layer: no value, a label — whose rollout this is (``rollout_attribution``,
    the seeds' name) and why it ended. The episode's owner can still change after it: a
    reward component that crashes makes the episode the evaluator's, whatever the rollout
    was (`tracerl show` prints both)."""
    return Score(
        0.0, {"rollout_attribution": ctx.attribution.value, "stop_reason": ctx.stop_reason}
    )


SEARCH_REWARD = """
components:
  - {name: attribution, fn: attribution_label, layer: attribution, weight: 0.0}
  - {name: format, fn: answered, layer: constraint, weight: 0.0, gate: 1.0}
  - {name: no_forbidden, fn: no_forbidden, layer: constraint, weight: 0.0, gate: 1.0}
  - {name: em, fn: exact_match, layer: outcome, weight: 1.0, gate: 1.0}
  - {name: sub_em, fn: sub_exact_match, layer: outcome, weight: 0.0}
  - {name: f1, fn: f1, layer: outcome, weight: 0.0}
  - {name: citations, fn: citations_valid, layer: process, weight: 0.3}
  - {name: valid_calls, fn: valid_calls, layer: process, weight: 0.1}
  - {name: search_cost, fn: search_cost, layer: cost, weight: 1.0, cap: 0.1,
     params: {per_search: 0.02}}
"""
"""The default search reward: format, no forbidden calls and exact match gate everything
else (sub-EM and F1 are logged, never paid: they are easy to game); citations and valid calls
add a little; searching costs a little, capped at 0.1 (< the 1.0 for a correct
answer: saving cost can never beat finishing the task)."""
