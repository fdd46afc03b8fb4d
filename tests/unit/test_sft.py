"""SFT reports the NLL of its data before the first update and after the last one, so a
single epoch shows what it changed (its training loss alone would be one number twice)."""

from __future__ import annotations

import asyncio
import copy

import pytest

from tracerl.envs import get_parser, make
from tracerl.rollout import ScriptedSampler
from tracerl.rollout.budget import Budgets, RolloutConfig
from tracerl.rollout.groups import episode_task_id, run_groups
from tracerl.rollout.runner import Policy
from tracerl.train.batch import bucketed_batches
from tracerl.train.sft import mean_nll, sft

CFG = RolloutConfig(budgets=Budgets(steps=1), max_turn_tokens=4, reserve=None)


def _reference_trajectories(tiny):
    """Correct answers to eight sums, written by a script through the rollout engine."""
    tasks = make("arithmetic").sample_tasks(8, seed=0)
    by_id = {t["id"]: t for t in tasks}
    policy = Policy(
        ScriptedSampler.from_texts(
            tiny.renderer, lambda r: by_id[episode_task_id(r.episode_id)]["answers"][0]
        ),
        tiny.renderer,
        get_parser("json_list"),
        tiny.spec,
    )
    groups = asyncio.run(run_groups("arithmetic", tasks, policy, CFG, group_size=1))
    return [t for g in groups for e in g for t in e.trajectories]


def test_one_epoch_reports_the_nll_before_and_after_training(tiny):
    model = copy.deepcopy(tiny.model)  # updates must not leak into other tests
    trajs = _reference_trajectories(tiny)
    batches = bucketed_batches(trajs, [0.0] * len(trajs), 64)
    untrained = mean_nll(model, batches)

    result = sft(model, trajs, lr=1e-2, epochs=1, micro_batch_tokens=64)

    assert len(result.nll_epochs) == 1
    assert result.nll_before == pytest.approx(untrained, rel=1e-4)  # before the first update
    assert result.nll_after == pytest.approx(mean_nll(model, batches), rel=1e-4)  # after the last
    assert result.nll_after < result.nll_before - 0.5, result
