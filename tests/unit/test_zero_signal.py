"""Groups that cannot teach anything are counted: all eligible rewards equal, or fewer than
two eligible members (their advantages are zero everywhere)."""

from __future__ import annotations

import pytest

from tracerl.train.metrics import signal_metrics


def test_zero_signal_groups_are_counted_by_their_eligible_rewards():
    rewards = [1.0, 1.0, 1.0, 0.0, 1.0, 0.5, 0.0, 0.0, 0.3]
    eligible = [True, True, True, True, False, True, True, False, True]
    # g0 (1, 1, 1): no signal; g1 (0, [1 out], 0.5): signal; g2 (0, [0 out]): one eligible
    # member, no baseline; g3 (0.3): alone
    m = signal_metrics(rewards, eligible, [3, 3, 2, 1])
    assert m["train/zero_signal_groups"] == 3.0
    assert m["train/zero_signal_group_rate"] == pytest.approx(3 / 4)
    # an ineligible member's different reward does not give its group signal
    m = signal_metrics([1.0, 1.0, 0.0], [True, True, False], [3])
    assert m["train/zero_signal_groups"] == 1.0
