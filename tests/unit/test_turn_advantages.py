"""Turn-level advantage estimators against hand-computed values: episodes of unequal
length, ineligible turns and episodes, a lone eligible member, ties, and step groups."""

from __future__ import annotations

import pytest
import torch

from tracerl.algos.turn_advantages import TURN_ADVANTAGES, Turns, get, returns_to_go

T = torch.tensor
B = lambda *xs: torch.tensor(xs, dtype=torch.bool)  # noqa: E731


def three(eligible_turns=None, states=None):
    """One group of three: E0 r=[0.1, 0.0] R=1; E1 r=[0.2] R=0; E2 r=[0.0, 0.3, 0.0] R=1."""
    turns = Turns(
        episode_T=T([0, 0, 1, 2, 2, 2]),
        index_T=T([0, 1, 0, 0, 1, 2]),
        reward_T=T([0.1, 0.0, 0.2, 0.0, 0.3, 0.0]),
        eligible_T=eligible_turns if eligible_turns is not None else B(*[True] * 6),
        state_T=states,
    )
    return turns, T([1.0, 0.0, 1.0]), T([0, 0, 0]), B(True, True, True)


def close(a, b, atol=1e-6):
    assert torch.allclose(a.double(), T(b).double(), atol=atol), (a.tolist(), b)


def test_returns_to_go_sum_later_step_rewards_and_the_outcome():
    turns, outcome, _, _ = three()
    close(returns_to_go(turns, outcome), [1.1, 1.0, 0.2, 1.3, 1.3, 1.0])
    # gamma 0.5, E2: t2 = 0 + 1; t1 = 0.3 + 0.5 * 1; t0 = 0 + 0.5 * 0.8
    close(returns_to_go(turns, outcome, gamma=0.5)[3:], [0.4, 0.8, 1.0])


def test_turn_returns_with_unequal_lengths_compare_turns_at_the_same_index():
    turns, outcome, group, eligible = three()
    adv = get("turn_returns")(turns, outcome, group, eligible)
    # E0 t0: 1.1 - mean(0.2, 1.3);  E0 t1: 1.0 - 1.3 (only E2 reached t1)
    # E1 t0: 0.2 - mean(1.1, 1.3);  E2 t0: 1.3 - mean(1.1, 0.2);  E2 t1: 1.3 - 1.0
    # E2 t2: nobody else reached turn 2, no baseline: 0
    close(adv, [0.35, -0.3, -1.0, 0.65, 0.3, 0.0])


def test_an_ineligible_turn_gets_zero_and_is_no_ones_baseline():
    turns, outcome, group, eligible = three(eligible_turns=B(True, True, True, True, False, True))
    adv = get("turn_returns")(turns, outcome, group, eligible)
    # E2 t1 failed in the environment: 0, and E0 t1 has nobody to compare with
    close(adv, [0.35, 0.0, -1.0, 0.65, 0.0, 0.0])


def test_an_ineligible_episode_and_a_lone_eligible_member_give_zero():
    turns, outcome, group, _ = three()
    only_e0 = B(True, False, False)
    for name in TURN_ADVANTAGES:
        states = T([0, 1, 0, 0, 1, 2])
        turns_s = Turns(turns.episode_T, turns.index_T, turns.reward_T, turns.eligible_T, states)
        adv = get(name)(turns_s, outcome, group, only_e0)
        close(adv, [0.0] * 6)
    adv = get("turn_returns")(turns, outcome, group, B(True, False, True))
    # E1 out: E0 t0 is compared with E2 t0 alone
    close(adv, [1.1 - 1.3, 1.0 - 1.3, 0.0, 1.3 - 1.1, 1.3 - 1.0, 0.0])


def test_ties_teach_nothing():
    turns = Turns(T([0, 0, 1]), T([0, 1, 0]), T([0.0, 0.0, 0.0]), B(True, True, True), T([7, 8, 7]))
    outcome, group, eligible = T([1.0, 1.0]), T([0, 0]), B(True, True)
    for name in TURN_ADVANTAGES:
        close(get(name)(turns, outcome, group, eligible), [0.0, 0.0, 0.0])


def test_outcome_broadcast_is_the_episode_advantage_on_each_usable_turn():
    turns, outcome, group, eligible = three(eligible_turns=B(True, False, True, True, True, True))
    adv = get("outcome")(turns, outcome, group, eligible)
    # the advantage of each episode's whole return (outcome + its turns' own rewards):
    # [1.1, 0.2, 1.3], mean 0.8667, std 0.5859 -> [0.398, -1.138, 0.740]
    close(adv, [0.3982, 0.0, -1.1378, 0.7395, 0.7395, 0.7395], atol=1e-4)


def test_equal_rewards_reached_by_different_sums_have_equal_returns():
    # E0 earns 0.1 then 0.2, E1 0.2 then 0.1, E2 0.3 at once, each 0.4 more at the end: every
    # episode's reward is 0.7, but 0.1 + 0.2 and 0.3 differ in the last bit of a float
    turns = Turns(
        episode_T=T([0, 0, 1, 1, 2]),
        index_T=T([0, 1, 0, 1, 0]),
        reward_T=torch.tensor([0.1, 0.2, 0.2, 0.1, 0.3], dtype=torch.float64),
        eligible_T=B(*[True] * 5),
        state_T=T([1, 2, 1, 3, 1]),
    )
    outcome = torch.tensor([0.4, 0.4, 0.4], dtype=torch.float64)
    g = returns_to_go(turns, outcome)
    assert g[0] == g[2] == g[4]  # 0.7 each, exactly
    for name in ("outcome", "step_groups"):
        adv = get(name)(turns, outcome, T([0, 0, 0]), B(True, True, True))
        # the whole returns tie: no episode advantage (grpo would divide a rounding error
        # by a std of about 1e-17 + 1e-6); only the turns from different states differ
        assert adv[[0, 2, 4]].abs().max() < 1e-9, (name, adv)


def test_step_groups_compare_turns_acting_from_the_same_state():
    # group 0: E0 [s0, s1] R=1, E1 [s0, s2] R=0, E2 [s0, s1] R=0; group 1: E3 [s0] R=5
    turns = Turns(
        episode_T=T([0, 0, 1, 1, 2, 2, 3]),
        index_T=T([0, 1, 0, 1, 0, 1, 0]),
        reward_T=torch.zeros(7),
        eligible_T=B(*[True] * 7),
        state_T=T([10, 11, 10, 12, 10, 11, 10]),
    )
    outcome, group, eligible = T([1.0, 0.0, 0.0, 5.0]), T([0, 0, 0, 1]), B(True, True, True, True)
    adv = get("step_groups")(turns, outcome, group, eligible)
    # episode (RLOO): [1.0, -0.5, -0.5]; steps: E0 +1 at s0 (vs 0, 0) and s1 (vs E2's 0);
    # E1 -0.5 at s0, 0 at s2 (alone); E2 -0.5 at s0, -1 at s1; E3's s0 is another task's
    close(adv, [2.0, 2.0, -1.0, -0.5, -1.0, -1.5, 0.0])
    half = get("step_groups")(turns, outcome, group, eligible, omega=0.5)
    close(half, [1.5, 1.5, -0.75, -0.5, -0.75, -1.0, 0.0])


def test_step_groups_need_state_keys_and_unknown_names_are_refused():
    turns, outcome, group, eligible = three()
    with pytest.raises(ValueError, match="state key"):
        get("step_groups")(turns, outcome, group, eligible)
    with pytest.raises(KeyError, match="valid: outcome, turn_returns, step_groups"):
        get("per_token")
