"""Verdicts and the recommendation, from the numbers of `tracerl.readiness.measure`."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tracerl.readiness import measure as M
from tracerl.rollout.episode import Policy, ScoreFn

SCHEMA = "tracerl.readiness/1"
Verdict = Literal["pass", "warn", "fail"]

THRESHOLDS: dict[str, float] = {
    # 1 verifier: any self-disagreement fails
    "perturbation_disagreement_fail": 0.05,
    "evaluator_error_warn": 0.0,
    "evaluator_error_fail": 0.05,
    "undecided_warn": 0.05,
    "undecided_fail": 0.20,
    # 2 environment: any non-deterministic reset fails
    "replay_drift_fail": 0.0,
    "env_error_warn": 0.02,
    "env_error_fail": 0.10,
    # 3 headroom
    "format_valid_fail": 0.5,
    "format_valid_warn": 0.8,
    "groups_varying_warn": 0.2,
    "saturated_pass_at_1": 0.95,
    "context_overflow_warn": 0.1,
    # 4 cost: the most RL can gain without new skills is pass@k - pass@1
    "gain_warn": 0.05,
}

ACTIONS = {
    "fix_environment": "Fix the environment first: version, cache, time out and isolate faults "
    "until a reset and a replay give the same observations.",
    "fix_verifier": "Fix the verifier first: it must give the same score twice, ignore harmless "
    "formatting, and decide almost every episode.",
    "sft_first": "Do SFT first (`tracerl sft` on good trajectories, e.g. a reference agent's): "
    "RL needs a policy that already succeeds sometimes and speaks the action format.",
    "no_rl_needed": "No RL needed: the policy already solves these tasks. Evaluate on harder "
    "ones before paying for training.",
    "small_rl_experiment": "Run a small RL experiment first (a few steps, held-out evaluation) "
    "and scale only if held-out success moves.",
    "rl": "Go ahead with RL: a small experiment, then scale.",
}


@dataclass
class Check:
    question: str  # verifier | environment | headroom | cost
    title: str
    verdict: Verdict
    numbers: dict[str, float]
    reasons: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "question": self.question,
            "title": self.title,
            "verdict": self.verdict,
            "numbers": {k: (None if math.isnan(v) else v) for k, v in self.numbers.items()},
            "reasons": self.reasons,
        }


@dataclass
class Readiness:
    checks: list[Check]
    action: str
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def recommendation(self) -> str:
        return ACTIONS[self.action]

    def check(self, question: str) -> Check:
        return next(c for c in self.checks if c.question == question)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "config": self.config,
            "checks": [c.to_json() for c in self.checks],
            "recommendation": {"action": self.action, "text": self.recommendation},
        }


def _grade(reasons: list[tuple[Verdict, str]]) -> tuple[Verdict, list[str]]:
    order = {"pass": 0, "warn": 1, "fail": 2}
    verdict: Verdict = max((v for v, _ in reasons), key=order.__getitem__, default="pass")
    return verdict, [f"{v}: {r}" for v, r in reasons]


def _verifier(n: dict[str, float], t: dict[str, float]) -> Check:
    r: list[tuple[Verdict, str]] = []
    if n["self_disagreement_rate"] > 0:
        r.append(("fail", f"scored twice, {n['self_disagreement_rate']:.0%} of episodes differ"))
    p = n["perturbation_disagreement_rate"]
    if p > 0:
        r.append(
            (
                "fail" if p > t["perturbation_disagreement_fail"] else "warn",
                f"{p:.0%} change score under whitespace or citation order",
            )
        )
    err = n["evaluator_error_rate"]
    if err > t["evaluator_error_warn"]:
        v: Verdict = "fail" if err > t["evaluator_error_fail"] else "warn"
        r.append((v, f"the evaluator crashed on {err:.0%}"))
    und = n["undecided_rate"]
    if und > t["undecided_warn"]:
        r.append(("fail" if und > t["undecided_fail"] else "warn", f"{und:.0%} undecidable"))
    verdict, reasons = _grade(r)
    return Check("verifier", "Can success be verified reliably?", verdict, n, reasons)


def _environment(n: dict[str, float], t: dict[str, float]) -> Check:
    r: list[tuple[Verdict, str]] = []
    if n["reset_nondeterministic_rate"] > 0:
        r.append(
            (
                "fail",
                f"{n['reset_nondeterministic_rate']:.0%} of tasks reset differently "
                "with the same seed",
            )
        )
    if n["reset_failure_rate"] > 0:
        r.append(("fail", f"{n['reset_failure_rate']:.0%} of resets raised"))
    drift = n["replay_drift_rate"]
    if not math.isnan(drift) and drift > t["replay_drift_fail"]:
        r.append(("fail", f"{drift:.0%} of replayed episodes drifted from the live environment"))
    if math.isnan(drift):
        r.append(("warn", "no episode could be replayed against the live environment"))
    err = n["env_error_rate"]
    if err > t["env_error_warn"]:
        v: Verdict = "fail" if err > t["env_error_fail"] else "warn"
        r.append((v, f"{err:.0%} of episodes failed on the environment's side"))
    verdict, reasons = _grade(r)
    return Check("environment", "Does the environment reset stably?", verdict, n, reasons)


def _headroom(n: dict[str, float], t: dict[str, float]) -> Check:
    r: list[tuple[Verdict, str]] = []
    fmt = n["format_valid_rate"]
    if not math.isnan(fmt) and fmt < t["format_valid_warn"]:
        v: Verdict = "fail" if fmt < t["format_valid_fail"] else "warn"
        r.append((v, f"only {fmt:.0%} of model turns are well-formed actions"))
    if n["pass_at_k"] == 0:
        r.append(("fail", f"no success in any group (pass@{n['k']:.0f} = 0): nothing to reinforce"))
    elif n["pass_at_1"] >= t["saturated_pass_at_1"]:
        r.append(("fail", f"pass@1 = {n['pass_at_1']:.0%}: already solved, nothing to learn"))
    if n["groups_varying"] < t["groups_varying_warn"]:
        r.append(
            (
                "warn",
                f"only {n['groups_varying']:.0%} of groups have rewards that vary "
                f"(all-fail {n['groups_all_fail']:.0%}, "
                f"all-success {n['groups_all_success']:.0%}): "
                "GRPO learns nothing from the rest",
            )
        )
    overflow = n.get("context_overflow_rate", 0.0)
    if overflow > t["context_overflow_warn"]:
        r.append(
            (
                "warn",
                f"{overflow:.0%} of episodes overflow budgets.context_tokens: they end before "
                "an answer (rollout.context.policy: compact or drop_observations continues "
                "them in new samples; docs/long-horizon.md)",
            )
        )
    verdict, reasons = _grade(r)
    title = "Is there headroom that RL can use?"
    return Check("headroom", title, verdict, n, reasons)


def _cost(n: dict[str, float], gain: float, t: dict[str, float]) -> Check:
    n = {**n, "possible_gain": gain}
    r: list[tuple[Verdict, str]] = []
    if gain < t["gain_warn"]:
        r.append(("warn", f"pass@k - pass@1 = {gain:.2f}: little for RL to gain"))
    r.append(
        (
            "pass",
            f"one step ~{n['step_s']:.0f} s ({n['tokens_per_step']:.0f} tokens); "
            f"the configured {n['run_steps']:.0f} steps ~{n['run_s'] / 60:.1f} min",
        )
    )
    verdict, reasons = _grade(r)
    return Check("cost", "Does the benefit cover the sampling cost?", verdict, n, reasons)


def judge(numbers: dict[str, dict[str, float]], thresholds: dict | None = None) -> Readiness:
    """Verdicts and the recommendation from measured numbers (``verifier``, ``environment``,
    ``headroom``, ``cost`` dicts)."""
    t = {**THRESHOLDS, **(thresholds or {})}
    h = numbers["headroom"]
    gain = max(0.0, h["pass_at_k"] - h["pass_at_1"])
    checks = [
        _verifier(numbers["verifier"], t),
        _environment(numbers["environment"], t),
        _headroom(h, t),
        _cost(numbers["cost"], gain, t),
    ]
    v = {c.question: c.verdict for c in checks}
    fmt = h["format_valid_rate"]
    if v["environment"] == "fail":
        action = "fix_environment"
    elif v["verifier"] == "fail":
        action = "fix_verifier"
    elif h["pass_at_k"] == 0 or (not math.isnan(fmt) and fmt < t["format_valid_fail"]):
        action = "sft_first"
    elif h["pass_at_1"] >= t["saturated_pass_at_1"]:
        action = "no_rl_needed"
    elif "warn" in v.values():
        action = "small_rl_experiment"
    else:
        action = "rl"
    return Readiness(checks, action)


async def measure_readiness(
    env: Callable[[], Any],
    tasks: Sequence[dict[str, Any]],
    policy: Policy,
    score: ScoreFn,
    rollout: Any,
    *,
    group_size: int,
    steps: int,
    model: Any = None,
    learner_config: Any = None,
    compare: Policy | None = None,
    seed: int = 0,
    backend: Any = None,
) -> dict[str, dict[str, float]]:
    """The numbers of all four questions, from one sampled step (`tasks` x `group_size`).
    `model` / `learner_config`: time one update on a copy (else the update is not timed);
    `compare`: a second policy (an SFT checkpoint) sampled on the same tasks; `backend`:
    where episodes run (an agent's gateway: `tracerl.gateway`)."""
    sample = await M.sample_groups(env, tasks, policy, rollout, group_size, score, seed, backend)
    episodes = sample.episodes
    environment = {
        **await M.reset_numbers(env, tasks[: M.RESET_TASKS], seed),
        **await M.replay_numbers(episodes, env),
        "env_error_rate": M.env_error_rate(episodes),
    }
    headroom = M.headroom_numbers(sample.groups)
    if compare is not None:
        other = await M.sample_groups(
            env, tasks, compare, rollout, group_size, score, seed, backend
        )
        theirs = M.headroom_numbers(other.groups)
        headroom.update(
            {f"compare_{k}": theirs[k] for k in ("pass_at_1", "pass_at_k", "format_valid_rate")}
        )
    update_s = M.timed_update(model, episodes, learner_config) if model is not None else 0.0
    return {
        "verifier": M.verifier_numbers(episodes, score),
        "environment": environment,
        "headroom": headroom,
        "cost": M.cost_numbers(sample, update_s, steps),
    }
