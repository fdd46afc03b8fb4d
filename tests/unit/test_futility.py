"""A run stops when nothing can be learned: K steps in a row whose every episode is
ineligible for one owner (the environment, or the evaluator) end it, naming the owner and
the most common fault; anything the policy could learn from resets the count."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tracerl.train.futility import Futility, UnlearnableRun
from tracerl.types import Attribution, RewardBreakdown, StopReason


def _episode(reward, attribution, eligible, stop, error=None):
    return SimpleNamespace(
        reward=reward,
        attribution=attribution,
        gradient_eligible=eligible,
        stop_reason=stop,
        receipt=SimpleNamespace(error=error),
    )


def _policy(reward: float = 0.0):
    return _episode(
        RewardBreakdown.scalar(reward, Attribution.POLICY),
        Attribution.POLICY,
        True,
        StopReason.ANSWERED,
    )


def _outage(error: str = "ConnectionError: database at db:5432 unreachable"):
    return _episode(
        RewardBreakdown.scalar(0.0, Attribution.ENVIRONMENT),
        Attribution.ENVIRONMENT,
        False,
        StopReason.INFRA_FAILURE,
        error,
    )


def _crashed_reward(error: str = "TypeError: unsupported operand"):
    # the rollout was fine: the reward code crashed
    return _episode(RewardBreakdown.crashed(error), Attribution.POLICY, True, StopReason.ANSWERED)


def test_k_dead_steps_in_a_row_stop_the_run_naming_the_owner_and_the_fault():
    f = Futility(3, "runs/x")
    step = [_outage(), _outage(), _outage("TimeoutError: reset took 30 s")]
    assert f.observe(0, step) is None
    assert f.observe(1, step) is None
    stop = f.observe(2, step)
    assert isinstance(stop, UnlearnableRun)
    assert stop.owner is Attribution.ENVIRONMENT
    assert "steps 0-2" in stop.message and "environment's failure" in stop.message
    assert "6 of 9: ConnectionError: database at db:5432 unreachable" in stop.message
    assert "--resume" in stop.hint and "runs/x" in stop.hint


def test_the_evaluators_steps_count_for_the_evaluator():
    f = Futility(2)
    assert f.observe(4, [_crashed_reward()] * 2) is None
    stop = f.observe(5, [_crashed_reward()] * 2)
    assert stop is not None and stop.owner is Attribution.EVALUATOR
    assert "TypeError: unsupported operand" in stop.message and "steps 4-5" in stop.message
    assert "reward" in stop.hint


@pytest.mark.parametrize(
    "between",
    [
        [_outage(), _policy(0.0)],  # one episode the policy can learn from
        [_outage(), _crashed_reward()],  # two owners: a flaky world, not a dead one
        [],  # no episodes (nothing was sampled): nothing to judge
    ],
    ids=["one-eligible", "split-owners", "empty"],
)
def test_a_step_the_policy_could_learn_from_starts_the_count_again(between):
    f = Futility(2)
    assert f.observe(0, [_outage()] * 2) is None
    assert f.observe(1, between) is None
    assert f.observe(2, [_outage()] * 2) is None  # one dead step since the reset: go on
    assert f.observe(3, [_outage()] * 2) is not None


def test_a_change_of_owner_starts_the_count_again_and_none_never_stops():
    f = Futility(2)
    assert f.observe(0, [_outage()]) is None
    assert f.observe(1, [_crashed_reward()]) is None
    assert f.observe(2, [_crashed_reward()]) is not None
    never = Futility(None)
    assert all(never.observe(s, [_outage()]) is None for s in range(10))


def test_a_teacher_that_grades_nothing_stops_the_run_as_the_evaluators():
    f = Futility(2, "runs/x")
    dead = {"train/distill/coverage": 0.0, "train/distill/teacher_failures": 4.0}
    some = {"train/distill/coverage": 0.25, "train/distill/teacher_failures": 3.0}
    assert f.observe(0, [_policy(1.0)] * 2, dead) is None
    assert f.observe(1, [_policy(1.0)] * 2, some) is None  # a quarter trained: go on
    assert f.observe(2, [_policy(1.0)] * 2, dead) is None
    stop = f.observe(3, [_policy(1.0)] * 2, dead)
    assert stop is not None and stop.owner is Attribution.EVALUATOR
    assert "teacher scored no sample" in stop.message and "teacher" in stop.hint
    refused = {"train/distill/coverage": 0.0, "train/distill/budget_refusals": 4.0}
    g = Futility(1)
    assert g.observe(0, [_policy()], refused) is not None  # a budget that admits nothing
    assert Futility(1).observe(0, [_policy()], {"train/distill/coverage": 1.0}) is None
