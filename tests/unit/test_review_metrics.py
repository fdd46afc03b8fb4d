"""Undecided episodes are never a 0: means of rewards and success figures count decided
episodes only, and are absent (undefined) when none decided."""

from __future__ import annotations

from types import SimpleNamespace

from tracerl.train.metrics import sample_metrics, shown, train_reward_mean


def _e(succeeded: bool, decided: bool = True) -> SimpleNamespace:
    return SimpleNamespace(reward=SimpleNamespace(succeeded=succeeded, decided=decided))


def test_undecided_samples_are_left_out_of_mean_and_pass_at_k():
    # task 1: one success, one undecided; task 2: one failure; task 3: undecided only
    groups = [[_e(True), _e(False, False)], [_e(False), _e(False)], [_e(False, False)] * 2]
    m = sample_metrics(groups)
    assert m["mean@2"] == 0.5 and m["pass@2"] == 0.5  # over tasks 1 and 2
    assert sample_metrics([[_e(False, False)], [_e(False, False)]]) == {}  # undefined


def test_the_training_mean_reward_counts_decided_episodes_only():
    episodes = [_e(True), _e(False, False), _e(False)]
    assert train_reward_mean(episodes, [1.0, 0.0, 0.5]) == {"train/reward_mean": 0.75}
    assert train_reward_mean([_e(False, False)] * 2, [0.0, 0.0]) == {}
    assert shown(None) == "undefined" and shown(0.25) == "0.250"
