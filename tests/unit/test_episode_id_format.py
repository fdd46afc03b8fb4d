"""Episode ids: the task and the member read back from any id, a stage or not; a stage that
could be read as another field is refused."""

from __future__ import annotations

import pytest

from tracerl.rollout.groups import episode_member, episode_task_id, group_episode_id


@pytest.mark.parametrize("task_id", ["sum-1-3", "orders:s3:g9", "a:b"])
@pytest.mark.parametrize("stage", [None, "warm", "eval-baseline", "eval-train-adversarial"])
def test_the_task_and_member_read_back_from_every_id(task_id, stage):
    eid = group_episode_id({"id": task_id}, 1_000_000, 3, 2, stage)
    assert episode_task_id(eid) == task_id and episode_member(eid) == 3
    assert eid.replace("-", "").replace("_", "").replace(":", "").isalnum()  # server-safe


def test_phases_that_share_a_seed_get_different_ids():
    task = {"id": "t"}
    ids = {group_episode_id(task, 0, 0, 0, stage) for stage in (None, "warm", "eval-baseline")}
    assert len(ids) == 3


@pytest.mark.parametrize("stage", ["step", "train", "g1", "a:b", "x@y", ""])
def test_a_stage_that_could_be_read_as_another_field_is_refused(stage):
    with pytest.raises(ValueError, match="episode id stage"):
        group_episode_id({"id": "t"}, 0, 0, 0, stage)
