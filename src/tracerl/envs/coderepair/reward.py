"""The code-repair reward, layered (`tracerl.rewards.compose`):

    constraint  no_forbidden_edits   a patch touched the tests (or another forbidden path):
                                     the gate closes, nothing after it is paid
    outcome     hidden_tests         the hidden acceptance tests pass (all, or the share);
                                     process and cost are paid only past this gate, so a
                                     hack that fails them earns no process credit either
    process     tested               the tests were run after the last patch, before answering
                patch_applies        the last patch applied cleanly
    cost        tool_cost            a little per tool call, capped

The outcome is read from the final step's info (the environment ran the hidden tests in the
sandbox when the agent answered); an episode that never answered scores 0.
"""

from __future__ import annotations

from typing import Any

from tracerl.rewards.compose import RewardContext, RewardSpec, Score, component, compose

CODE_REPAIR_REWARD = """
components:
  - {name: attribution, fn: attribution_label, layer: attribution, weight: 0.0}
  - {name: no_forbidden_edits, fn: no_forbidden_edits, layer: constraint, weight: 0.0, gate: 1.0}
  - {name: hidden_tests, fn: hidden_tests_pass, layer: outcome, weight: 1.0, gate: 1.0,
     params: {mode: all}}
  - {name: tested, fn: tested_after_patch, layer: process, weight: 0.1}
  - {name: patch_applies, fn: patch_applies, layer: process, weight: 0.1}
  - {name: tool_cost, fn: tool_cost, layer: cost, weight: 1.0, cap: 0.1,
     params: {per_call: 0.01}}
"""


def _final_info(ctx: RewardContext) -> dict[str, Any]:
    for s in reversed(ctx.steps):
        info = s.get("info") or {}
        if "hidden_tests" in info:
            return info
    return {}


def _calls(ctx: RewardContext) -> list[tuple[str, bool]]:
    """(tool, ok) of every call, in order."""
    return [
        (c["action"]["tool"], c["observation"]["status"] == "ok")
        for s in ctx.steps
        for c in s.get("calls", [])
    ]


@component("no_forbidden_edits")
def no_forbidden_edits(ctx: RewardContext) -> Score:
    """Constraint: no patch touched a forbidden path (the tests, the test runner)."""
    touched = sorted(
        {
            p
            for s in ctx.steps
            for c in s.get("calls", [])
            for p in (((c.get("result") or {}).get("effect") or {}).get("patch") or {}).get(
                "forbidden", []
            )
        }
        | set(_final_info(ctx).get("forbidden_touched", []))
    )
    return Score(0.0 if touched else 1.0, {"forbidden_touched": touched})


@component("hidden_tests_pass")
def hidden_tests_pass(ctx: RewardContext, mode: str = "all") -> Score:
    """Outcome: the hidden tests pass — 1/0 (`all`) or the share that pass (`share`)."""
    hidden = _final_info(ctx).get("hidden_tests")
    if not hidden:
        return Score(0.0, {"hidden_tests": None})  # never answered: nothing was fixed
    if mode == "all":
        return Score(float(bool(hidden.get("ok"))), {"hidden_tests": hidden})
    ran = hidden.get("ran", 0)
    bad = hidden.get("failures", 0) + hidden.get("errors", 0)
    return Score(max(0.0, (ran - bad) / ran) if ran else 0.0, {"hidden_tests": hidden})


@component("tested_after_patch")
def tested_after_patch(ctx: RewardContext) -> Score:
    """Process: the visible tests ran after the last applied patch (before answering)."""
    calls = _calls(ctx)
    last_patch = max(
        (i for i, (t, ok) in enumerate(calls) if t == "submit_patch" and ok), default=-1
    )
    ran = any(t == "run_tests" for t, _ in calls[last_patch + 1 :])
    return Score(float(last_patch >= 0 and ran), {"last_patch_call": last_patch})


@component("patch_applies")
def patch_applies(ctx: RewardContext) -> Score:
    """Process: the last patch the agent submitted applied cleanly."""
    patches = [ok for t, ok in _calls(ctx) if t == "submit_patch"]
    return Score(float(bool(patches) and patches[-1]), {"patches": len(patches)})


@component("tool_cost")
def tool_cost(ctx: RewardContext, per_call: float = 0.01) -> Score:
    """Cost: minus `per_call` per tool call (cap it in the spec)."""
    n = len(_calls(ctx))
    return Score(-per_call * n, {"calls": n})


def code_repair_reward(spec_yaml: str = CODE_REPAIR_REWARD):
    """The run's reward function (an episode -> its breakdown)."""
    spec = RewardSpec.from_yaml(spec_yaml)

    def score(e: Any):
        return compose(spec, RewardContext.from_trajectories(e.trajectories, lambda _: None))

    return score
