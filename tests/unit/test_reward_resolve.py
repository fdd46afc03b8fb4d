"""The run's reward is the task's: the environment's own verifier, a built-in, or the user's
function by import path, always through the composer (gates, caps, named components)."""

from __future__ import annotations

import pytest

from tracerl.config import ConfigError
from tracerl.config.loading import load_config
from tracerl.envs import RefundDesk, ToolEnv
from tracerl.errors import UserError
from tracerl.rewards import RewardContext, Score
from tracerl.rewards.resolve import adapt, as_score, resolve_reward
from tracerl.types import Attribution


def _ctx(answer: str | None, task: dict | None = None, stop: str = "answered") -> RewardContext:
    return RewardContext(
        task=task or {"id": "t", "expected": 1200.0},
        answer={"text": answer} if answer is not None else None,
        steps=[],
        stop_reason=stop,
        attribution=Attribution.POLICY,
    )


class Own(ToolEnv):
    name, version, splits = "own", "1", ("train", "test")

    async def setup(self, task, seed):
        return [{"role": "user", "content": "q"}]

    def sample_tasks(self, n, *, seed=0, split="train"):
        return [{"id": f"{split}-{i}", "expected": 1200.0} for i in range(n)]

    def reward(self, ctx):
        got = float(ctx.answer_text or "nan")
        return Score(float(abs(got - ctx.task["expected"]) <= 12), {"answer": got})


class Layered(Own):
    reward_components = """
components:
  - {name: format, fn: is_number, layer: constraint, weight: 0.0, gate: 1.0}
  - {name: close, fn: reward, layer: outcome, weight: 1.0}
  - {name: length, fn: length_cost, layer: cost, weight: 1.0, cap: 0.05}
"""

    def is_number(self, ctx):
        try:
            float(ctx.answer_text)
        except ValueError:
            return 0.0
        return 1.0

    def length_cost(self, completion):  # named arguments, like a TRL reward function
        return -0.01 * len(completion)


def _score(reward, answer):
    from tracerl.rewards.compose import compose

    return compose(reward.spec, _ctx(answer), reward.functions)


def test_an_env_with_a_reward_method_is_scored_by_it():
    r = resolve_reward(None, None, Own())
    assert r.component_names == ["attribution", "own"] and r.source == "own's own"
    assert _score(r, "1205").succeeded and not _score(r, "12").succeeded


def test_an_envs_layered_components_gate_and_cap_its_methods():
    r = resolve_reward(None, None, Layered())
    good = _score(r, "1200.00000001")
    assert good.succeeded and good.component("length").contribution == -0.05  # capped
    junk = _score(r, "twelve hundred")
    assert junk.component("close").gated and junk.total == 0.0  # the gate held


def test_an_env_without_a_reward_and_no_configured_reward_is_refused():
    with pytest.raises(UserError) as e:
        resolve_reward(None, None, RefundDesk())
    assert "has no reward of its own" in e.value.message and "trainer.reward" in e.value.hint


def test_a_configured_function_by_import_path_replaces_the_envs_own(tmp_path, monkeypatch):
    (tmp_path / "myrewards.py").write_text(
        "def exact(completion, expected):\n    return float(completion) == expected\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    r = resolve_reward("myrewards:exact", None, Own())
    assert r.component_names == ["attribution", "exact"]
    assert _score(r, "1200").succeeded and not _score(r, "1205").succeeded


def test_a_users_function_gets_its_arguments_by_name_and_its_return_read():
    def f(completion, task, stop_reason, tolerance=0.5, **kwargs):
        assert kwargs["expected"] == 1200.0  # a task field, as TRL passes dataset columns
        return (1.0, {"seen": completion}) if stop_reason == "answered" else None

    fn = adapt(f, "f")
    assert fn(_ctx("x")).evidence == {"seen": "x"}
    assert fn(_ctx("x", stop="max_steps")).decided is False  # None: could not decide
    with pytest.raises(TypeError, match="cannot pass parameter 'gold'"):
        adapt(lambda gold: 1.0, "g")(_ctx("x"))
    with pytest.raises(TypeError, match="return a number"):
        as_score("yes", "h")


def test_a_verifier_that_raises_is_the_evaluators_fault_never_a_zero(tmp_path):
    class Crashing(Own):
        def reward(self, ctx):
            raise RuntimeError("verifier down")

    b = _score(resolve_reward(None, None, Crashing()), "1200")
    assert b.attribution is Attribution.EVALUATOR and not b.decided and not b.eligible


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["env.name=refund_desk", "trainer.reward=null"], "has no reward of its own"),
        (["trainer.reward=exact_mtach"], "unknown reward 'exact_mtach'"),
        (["trainer.reward=tracerl.nope:f"], "no module named 'tracerl.nope'"),
        (["env.eval_split=test"], "has no split 'test'; its splits: train, heldout"),
    ],
)
def test_the_preflight_refuses_rewards_and_splits_that_do_not_resolve(overrides, message):
    from tracerl.preflight import prepare

    with pytest.raises(ConfigError) as e:
        prepare(load_config("configs/learn-arithmetic.yaml", overrides))
    assert message in e.value.message


def test_split_defaults_come_from_the_environment():
    from tracerl.preflight import default_splits

    assert default_splits(("train", "test")) == ("train", "test")
    assert default_splits(("train", "heldout", "adversarial")) == ("train", "heldout")
    assert default_splits(("dev", "train", "validation")) == ("train", "validation")
    assert default_splits(None) == ("train", "heldout")


def test_values_that_are_not_finite_are_the_evaluators_never_a_reward():
    import math

    with pytest.raises(TypeError, match="return a number"):
        as_score(math.inf, "f")

    class Infinite(Own):
        def reward(self, ctx):
            return Score(math.inf)

    b = _score(resolve_reward(None, None, Infinite()), "1200")
    assert b.attribution is Attribution.EVALUATOR and "not a finite number" in b.error


@pytest.mark.parametrize(
    ("components", "message"),
    [
        ([{"name": "a", "fn": "reward", "layer": "outcome", "weight": float("nan")}], "finite"),
        (
            [
                {"name": "a", "fn": "reward", "layer": "outcome"},
                {"name": "a", "fn": "reward", "layer": "process"},
            ],
            "component names must differ",
        ),
        ([{"name": "a", "fn": "reward", "layer": "process"}], "no component has layer: outcome"),
        ("- {name: a, fn: reward, layer: [outcome", "invalid YAML"),
    ],
)
def test_a_layered_spec_that_cannot_score_is_refused(components, message):
    with pytest.raises(UserError, match=message):
        resolve_reward(None, components, Own())


def test_functions_that_cannot_be_called_as_rewards_are_refused_when_resolved():
    from tracerl.rewards.resolve import check_functions

    async def later(completion):
        return 1.0

    with pytest.raises(UserError, match="async function"):
        adapt(later, "later")
    with pytest.raises(UserError, match="is a class"):
        adapt(Own, "Own")
    spec = [
        {"name": "close", "fn": "reward", "layer": "outcome"},
        {"name": "cost", "fn": "search_cost", "layer": "cost", "params": {"per_serch": 0.1}},
    ]
    problem = check_functions(resolve_reward(None, spec, Own()), {"id": "t", "expected": 1.0})
    assert problem == "component 'cost': search_cost takes no parameter(s) 'per_serch'"
