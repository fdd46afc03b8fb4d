"""Group baselines are computed over eligible members only; thin groups are dropped."""

from __future__ import annotations

import pytest

from tracerl.rewards.eligibility import baselines, group_baseline
from tracerl.types import Attribution, Layer, RewardBreakdown, RewardComponent


def _r(total, attribution=Attribution.POLICY, decided=True, em=None):
    value = total if em is None else em
    comp = RewardComponent("em", Layer.OUTCOME, value, 1.0, value)
    return RewardBreakdown((comp,), total, attribution, decided)


def test_an_outage_does_not_shift_the_other_members_advantages():
    g = [_r(1.0), _r(0.0), _r(0.0, Attribution.ENVIRONMENT), _r(1.0)]
    b = group_baseline(g)
    # over the eligible members only: (1 + 0 + 1) / 3, not (1 + 0 + 0 + 1) / 4
    assert b.baseline == pytest.approx(2 / 3)
    assert b.advantages_G[2] is None and b.eligible_G == (True, True, False, True)
    assert b.advantages_G[0] == pytest.approx(1 / 3) and b.advantages_G[1] == pytest.approx(-2 / 3)


def test_a_success_despite_the_environment_still_counts_but_evaluator_errors_never_do():
    assert _r(1.0, Attribution.ENVIRONMENT, em=1.0).eligible
    assert not _r(0.0, Attribution.ENVIRONMENT).eligible
    assert not _r(1.0, Attribution.EVALUATOR, decided=False).eligible
    assert not _r(1.0, decided=False).eligible  # undecided: off to the review pool


def test_groups_with_fewer_than_two_eligible_members_are_dropped_and_counted():
    groups = [
        [_r(1.0), _r(0.0)],
        [_r(1.0), _r(0.0, Attribution.ENVIRONMENT), _r(0.0, Attribution.UNKNOWN)],
    ]
    out, m = baselines(groups)
    assert not out[0].dropped and out[1].dropped
    assert out[1].advantages_G == (None, None, None)
    assert m["attribution/groups_dropped"] == 1 and m["attribution/eligible_rate"] == 3 / 5
