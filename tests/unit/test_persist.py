"""The episode writer: durable per-episode appends; a crash mid-write loses only that one."""

from __future__ import annotations

import gzip

from tracerl.rollout.persist import EpisodeWriter, iter_episode_files, read_run_trajectories
from tracerl.types import Segment, Source, Trajectory


def _traj(i: int) -> Trajectory:
    return Trajectory(
        segments=(
            Segment(Source.PROMPT, (1, 2, 3)),
            Segment(Source.POLICY, (4, 5), (-0.5, -0.25)),
        ),
        episode_id=f"ep{i}",
    )


def test_each_append_is_a_complete_gzip_member(tmp_path):
    w = EpisodeWriter(tmp_path, step=3)
    for i in range(3):
        w.append([_traj(i)])
    assert w.episodes == 3 and w.path.name == "step_3.jsonl.gz"
    # Any gzip reader sees one stream of three lines.
    assert gzip.decompress(w.path.read_bytes()).decode().count("\n") == 3
    assert [t.episode_id for _, t in read_run_trajectories(tmp_path)] == ["ep0", "ep1", "ep2"]


def test_a_torn_write_is_skipped_by_readers_and_cut_by_the_next_writer(tmp_path, caplog):
    w = EpisodeWriter(tmp_path, step=0)
    w.append([_traj(0)])
    w.append([_traj(1)])
    good = w.path.stat().st_size
    member = gzip.compress(b'{"schema": "tracerl.trajectory/1", "episode_id": "ep2"}\n')
    with open(w.path, "ab") as f:  # a crash halfway through the third append
        f.write(member[: len(member) // 2])
    assert [t.episode_id for _, t in read_run_trajectories(tmp_path)] == ["ep0", "ep1"]
    assert "torn last write" in caplog.text
    resumed = EpisodeWriter(tmp_path, step=0)  # e.g. the run restarts
    assert resumed.path.stat().st_size == good
    resumed.append([_traj(3)])
    ids = [t.episode_id for _, t in read_run_trajectories(tmp_path)]
    assert ids == ["ep0", "ep1", "ep3"]


def test_step_files_are_read_in_step_order(tmp_path):
    for step in (10, 2, 1):
        EpisodeWriter(tmp_path, step=step).append([_traj(step)])
    assert [p.name for p in iter_episode_files(tmp_path)] == [
        "step_1.jsonl.gz",
        "step_2.jsonl.gz",
        "step_10.jsonl.gz",
    ]


def test_line_separator_characters_inside_text_survive(tmp_path):
    t = _traj(0)
    odd = Trajectory(
        segments=(Segment(Source.ENVIRONMENT, (7,), text="a\u2028b\u2029c\x85d"),),
        episode_id="odd",
    )
    EpisodeWriter(tmp_path, step=0).append([t, odd])
    back = [t for _, t in read_run_trajectories(tmp_path)]
    assert back[1].segments[0].text == "a\u2028b\u2029c\x85d"


def test_text_utf8_cannot_hold_is_written_and_read_back_as_it_was(tmp_path):
    """A lone surrogate (a tool or an agent harness returned it) must not stop the run from
    writing the episode."""
    odd = Trajectory(
        segments=(Segment(Source.ENVIRONMENT, (7,), text="x\ud800y"),),
        steps=({"step": 0, "observation_messages": [{"role": "tool", "content": "\udfff"}]},),
        episode_id="odd",
    )
    EpisodeWriter(tmp_path, step=0).append([_traj(0), odd])
    back = [t for _, t in read_run_trajectories(tmp_path)]
    assert back[1].segments[0].text == "x\ud800y"
    assert back[1].steps[0]["observation_messages"][0]["content"] == "\udfff"


def test_damage_in_the_middle_is_refused_not_cut(tmp_path):
    import pytest

    from tracerl.types import TrajectoryError

    w = EpisodeWriter(tmp_path, step=0)
    for i in range(3):
        w.append([_traj(i)])
    data = bytearray(w.path.read_bytes())
    first = gzip.compress(b"x")  # find the second member and damage its body
    second = data.find(b"\x1f\x8b\x08", 1)
    data[second + 15] ^= 0xFF
    w.path.write_bytes(bytes(data))
    with pytest.raises(TrajectoryError, match="not a torn last write"):
        EpisodeWriter(tmp_path, step=0)
    assert w.path.read_bytes() == bytes(data) and first  # nothing was cut
