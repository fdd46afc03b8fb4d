"""`tracerl readiness`: each verdict on a deliberately broken setup (a non-deterministic
environment, a flaky verifier, an always-0 task, an always-1 task, malformed tool calls),
and a healthy one that gets the go-ahead."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from tracerl.envs import get_parser, make
from tracerl.envs.arithmetic import Arithmetic, digit_reward
from tracerl.readiness import SCHEMA, judge, measure_readiness
from tracerl.rollout import ScriptedSampler
from tracerl.rollout.budget import Budgets, RolloutConfig
from tracerl.rollout.groups import episode_member, episode_task_id
from tracerl.rollout.runner import Policy
from tracerl.train.learner import LearnerConfig

ROLLOUT = RolloutConfig(budgets=Budgets(steps=3), reserve=None)
TASKS = make("arithmetic").sample_tasks(4, seed=3)


def digit(e) -> float:
    segs = e.trajectories[0].policy_segments()
    return digit_reward((segs[0].text or "") if segs else "", e.receipt.task["answers"][0])


def right(task, g):
    return task["answers"][0]


def wrong(task, g):
    return str((int(task["answers"][0]) + 1) % 10)


def half(task, g):  # every group has a spread: members 0 and 2 right, 1 and 3 wrong
    return right(task, g) if g % 2 == 0 else wrong(task, g)


class Nondeterministic(Arithmetic):
    """Each reset shows a fresh request id: the same seed never gives the same observation."""

    async def setup(self, task, seed):
        messages = await super().setup(task, seed)
        return [{**messages[0], "content": f"[req {random.random():.6f}] {messages[0]['content']}"}]


def _policy(tiny, answer):
    by_id = {t["id"]: t for t in TASKS}

    def turn(request):
        task = by_id[episode_task_id(request.episode_id)]
        return answer(task, episode_member(request.episode_id))

    return Policy(
        ScriptedSampler.from_texts(tiny.renderer, turn, logprob=-0.5),
        tiny.renderer,
        get_parser("json_list"),
        "tiny-random",
    )


def _readiness(tiny, answer, *, env=Arithmetic, score=digit, model=True, compare=None):
    numbers = asyncio.run(
        measure_readiness(
            env,
            TASKS,
            _policy(tiny, answer),
            score,
            ROLLOUT,
            group_size=4,
            steps=20,
            model=tiny.model if model else None,
            learner_config=LearnerConfig(lr=1e-5),
            compare=_policy(tiny, compare) if compare else None,
        )
    )
    return judge(numbers)


def test_a_healthy_setup_gets_the_go_ahead_with_its_numbers(tiny):
    r = _readiness(tiny, half)
    assert {c.question: c.verdict for c in r.checks} == {
        "verifier": "pass",
        "environment": "pass",
        "headroom": "pass",
        "cost": "pass",
    }
    assert r.action == "rl"
    h = r.check("headroom").numbers
    assert h["pass_at_1"] == 0.5 and h["pass_at_k"] == 1.0 and h["groups_varying"] == 1.0
    assert h["format_valid_rate"] == 1.0
    env = r.check("environment").numbers
    assert env["replayed"] >= 1 and env["replay_drift_rate"] == 0.0
    cost = r.check("cost").numbers
    assert cost["episodes_per_step"] == 16 and cost["tokens_per_episode"] > 0
    assert cost["update_s_per_step"] > 0 and cost["run_s"] == pytest.approx(20 * cost["step_s"])
    assert cost["possible_gain"] == 0.5
    assert cost["group_s_mean"] >= cost["episode_s_mean"] > 0


def test_an_sft_checkpoint_is_measured_on_the_same_tasks(tiny):
    r = _readiness(tiny, wrong, model=False, compare=right)
    h = r.check("headroom").numbers
    assert h["pass_at_1"] == 0.0 and h["compare_pass_at_1"] == 1.0
    assert h["compare_format_valid_rate"] == 1.0


def test_a_non_deterministic_environment_is_fixed_first(tiny):
    r = _readiness(tiny, half, env=Nondeterministic, model=False)
    env = r.check("environment")
    assert env.verdict == "fail" and env.numbers["reset_nondeterministic_rate"] == 1.0
    assert any("reset differently" in x for x in env.reasons)
    assert r.action == "fix_environment"


def test_a_flaky_verifier_is_fixed_before_anything_is_trained(tiny):
    rng = random.Random(0)
    r = _readiness(tiny, half, score=lambda e: rng.random(), model=False)
    v = r.check("verifier")
    assert v.verdict == "fail" and v.numbers["self_disagreement_rate"] > 0.5
    assert r.action == "fix_verifier"


def test_a_verifier_fooled_by_whitespace_fails_and_one_that_crashes_is_counted(tiny):
    def strict(e):  # the first character, not the answer: padding changes the score
        segs = e.trajectories[0].policy_segments()
        return float((segs[0].text or "")[:1] == e.receipt.task["answers"][0])

    r = _readiness(tiny, half, score=strict, model=False)
    assert r.check("verifier").numbers["perturbation_disagreement_rate"] == 0.5
    assert r.check("verifier").verdict == "fail" and r.action == "fix_verifier"

    def crashes(e):
        raise RuntimeError("grader down")

    r = _readiness(tiny, half, score=crashes, model=False)
    v = r.check("verifier").numbers
    assert v["evaluator_error_rate"] == 1.0 and v["undecided_rate"] == 1.0
    assert r.action == "fix_verifier"


def test_an_always_0_task_has_nothing_to_reinforce(tiny):
    r = _readiness(tiny, wrong, model=False)
    h = r.check("headroom")
    assert h.verdict == "fail" and h.numbers["pass_at_k"] == 0.0
    assert h.numbers["groups_all_fail"] == 1.0 and h.numbers["groups_varying"] == 0.0
    assert r.action == "sft_first"


def test_an_always_1_task_needs_no_rl(tiny):
    r = _readiness(tiny, right, model=False)
    h = r.check("headroom")
    assert h.verdict == "fail" and h.numbers["pass_at_1"] == 1.0
    assert h.numbers["groups_all_success"] == 1.0
    assert r.check("cost").verdict == "warn"  # pass@k - pass@1 = 0: nothing to gain
    assert r.action == "no_rl_needed"


def test_malformed_tool_calls_send_the_policy_to_sft_first(tiny):
    def garbled(task, g):
        return "<tool_call>[{'name': add" if g % 4 else right(task, g)

    r = _readiness(tiny, garbled, model=False)
    h = r.check("headroom")
    assert h.numbers["format_valid_rate"] < 0.5
    assert any("well-formed" in x for x in h.reasons) and h.verdict == "fail"
    assert r.action == "sft_first"


def test_the_json_report_is_versioned_and_complete(tiny):
    r = _readiness(tiny, half, model=False)
    doc = json.loads(json.dumps(r.to_json()))  # JSON-able: NaN written as null
    assert doc["schema"] == SCHEMA
    assert [c["question"] for c in doc["checks"]] == [
        "verifier",
        "environment",
        "headroom",
        "cost",
    ]
    assert all(c["verdict"] in ("pass", "warn", "fail") for c in doc["checks"])
    assert doc["recommendation"]["action"] == r.action and doc["recommendation"]["text"]


def test_tracerl_readiness_runs_a_config_and_prints_json(tmp_path):
    from typer.testing import CliRunner

    from tracerl.cli import app

    out = CliRunner().invoke(
        app, ["readiness", "configs/learn-arithmetic.yaml", "--episodes", "16", "--json"]
    )
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert doc["schema"] == SCHEMA and doc["config"]["env"] == "arithmetic"
    h = next(c for c in doc["checks"] if c["question"] == "headroom")
    # a fresh random model almost never answers with a digit, let alone the right one
    assert h["numbers"]["pass_at_1"] < 0.2
    assert doc["recommendation"]["action"] in ("sft_first", "small_rl_experiment", "rl")
    table = CliRunner().invoke(
        app, ["readiness", "configs/learn-arithmetic.yaml", "--episodes", "8"]
    )
    assert table.exit_code == 0, table.output
    assert "recommendation" in table.output and "headroom" in table.output.lower()


def test_a_warning_alone_asks_for_a_small_experiment_first():
    numbers = {
        "verifier": {
            "self_disagreement_rate": 0.0,
            "perturbation_disagreement_rate": 0.0,
            "evaluator_error_rate": 0.0,
            "undecided_rate": 0.0,
        },
        "environment": {
            "reset_nondeterministic_rate": 0.0,
            "reset_failure_rate": 0.0,
            "replay_drift_rate": 0.0,
            "env_error_rate": 0.05,  # between the warning (2%) and the failure (10%)
        },
        "headroom": {
            "pass_at_1": 0.4,
            "pass_at_k": 0.9,
            "k": 8.0,
            "groups_varying": 0.8,
            "groups_all_success": 0.1,
            "groups_all_fail": 0.1,
            "format_valid_rate": 0.95,
        },
        "cost": {"step_s": 30.0, "tokens_per_step": 9000.0, "run_steps": 10.0, "run_s": 300.0},
    }
    r = judge(numbers)
    assert r.check("environment").verdict == "warn" and r.action == "small_rl_experiment"
    assert r.check("cost").numbers["possible_gain"] == pytest.approx(0.5)
    numbers["environment"]["env_error_rate"] = 0.0
    assert judge(numbers).action == "rl"
    numbers["environment"]["env_error_rate"] = 0.2
    assert judge(numbers).action == "fix_environment"


def test_episodes_that_overflow_their_context_are_reported(tiny):
    from tracerl.envs.parsers import parser_for_model
    from tracerl.rollout.reference import reference_policy

    probe = make("timeline")
    tasks = probe.sample_tasks(2)
    policy = reference_policy(
        tiny.renderer, "tiny-random", probe, tasks, parser_for_model("smollm2-135m-instruct")
    )
    rollout = RolloutConfig(
        budgets=Budgets(steps=12, tool_calls=12, context_tokens=512), reserve=None
    )
    numbers = asyncio.run(
        measure_readiness(
            lambda: make("timeline"), tasks, policy, lambda e: 0.0, rollout, group_size=2, steps=2
        )
    )
    h = judge(numbers).check("headroom")
    assert h.numbers["context_overflow_rate"] == 1.0  # the whole history needs ~850 tokens
    assert any("overflow budgets.context_tokens" in x for x in h.reasons)
