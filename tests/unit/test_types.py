"""Trajectory invariants and the JSONL(.gz) round trip."""

from __future__ import annotations

import gzip
import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracerl import Segment, Source, Trajectory, TrajectoryError
from tracerl.jsonl import read_trajectories, write_trajectories


def _traj() -> Trajectory:
    return Trajectory(
        segments=(
            Segment(Source.PROMPT, (1, 2, 3)),
            Segment(Source.TEMPLATE, (4,)),
            Segment(Source.POLICY, (5, 6), (-0.1, -2.5), step=0, finish_reason="stop"),
            Segment(Source.ECHO, (7,), step=0, tool_call_id="c1"),
            Segment(Source.ENVIRONMENT, (8, 9), step=0, tool_call_id="c1"),
        ),
        episode_id="ep-1",
    )


def test_derived_views_line_up_token_for_token():
    t = _traj()
    assert t.token_ids == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert t.loss_mask == [0, 0, 0, 0, 1, 1, 0, 0, 0]
    assert t.sources[4:6] == [Source.POLICY, Source.POLICY]
    assert t.logprobs == [0.0, 0.0, 0.0, 0.0, -0.1, -2.5, 0.0, 0.0, 0.0]
    assert t.count("echo") == 1


def test_policy_segment_needs_one_logprob_per_token():
    with pytest.raises(TrajectoryError, match="2 tokens but 1 logprobs"):
        Segment(Source.POLICY, (5, 6), (-0.1,))
    with pytest.raises(TrajectoryError, match="has no logprobs"):
        Segment(Source.POLICY, (5, 6))


def test_only_policy_tokens_carry_logprobs():
    with pytest.raises(TrajectoryError, match="environment segment carries logprobs"):
        Segment(Source.ENVIRONMENT, (5,), (-0.1,))


def test_bad_values_are_rejected_with_their_position():
    with pytest.raises(TrajectoryError, match="token 1 is -3"):
        Segment(Source.PROMPT, (1, -3))
    with pytest.raises(TrajectoryError, match=r"logprob 0 is 0.5"):
        Segment(Source.POLICY, (1,), (0.5,))
    with pytest.raises(TrajectoryError, match="unknown source 'robot'"):
        Segment("robot", (1,))


def test_jsonl_round_trip_is_exact(tmp_path):
    t = _traj()
    for name in ("a.jsonl", "a.jsonl.gz"):
        path = tmp_path / name
        write_trajectories(path, [t, t])
        back = read_trajectories(path)
        assert back == [t, t]
    with gzip.open(tmp_path / "a.jsonl.gz", "rt") as f:  # really gzip, readable by anyone
        assert json.loads(f.readline())["schema"] == "tracerl.trajectory/1"


def test_appending_to_gzip_keeps_earlier_trajectories(tmp_path):
    path = tmp_path / "e.jsonl.gz"
    write_trajectories(path, [_traj()], append=True)
    write_trajectories(path, [_traj()], append=True)
    assert len(read_trajectories(path)) == 2


def test_a_truncated_line_is_reported_with_file_and_line(tmp_path):
    path = tmp_path / "t.jsonl"
    write_trajectories(path, [_traj()])
    with open(path, "a") as f:
        f.write('{"schema": "tracerl.trajectory/1", "segm')
    with pytest.raises(TrajectoryError, match=r"t.jsonl:2: not valid JSON"):
        read_trajectories(path)
    assert path.read_text().count("\n") == 1  # reading never rewrites the file


def test_a_stored_segment_that_breaks_an_invariant_is_named(tmp_path):
    d = _traj().to_dict()
    d["segments"][2]["logprobs"] = [-0.1]
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(d) + "\n")
    with pytest.raises(TrajectoryError, match=r"bad.jsonl:1, segment 2: policy segment has 2"):
        read_trajectories(path)


def test_unknown_schema_is_rejected(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps({"schema": "other/9", "segments": []}) + "\n")
    with pytest.raises(TrajectoryError, match="schema is 'other/9'"):
        read_trajectories(path)


def _f32(x: float) -> float:
    """A float32 value, as a sampler computing in fp32 hands it over."""
    return struct.unpack("f", struct.pack("f", x))[0]


logprob = st.floats(max_value=0.0, allow_nan=False, allow_infinity=False, width=64) | st.floats(
    max_value=0.0, allow_nan=False, allow_infinity=False
).map(_f32)
nonpolicy = st.sampled_from([Source.PROMPT, Source.TEMPLATE, Source.ENVIRONMENT, Source.ECHO])
token_lists = st.lists(st.integers(0, 200_000), min_size=1, max_size=12)


@st.composite
def segments(draw):
    if draw(st.booleans()):
        ids = draw(token_lists)
        lps = draw(st.lists(logprob, min_size=len(ids), max_size=len(ids)))
        return Segment(Source.POLICY, ids, lps, step=draw(st.integers(0, 9)), policy_version=3)
    return Segment(draw(nonpolicy), draw(token_lists), text=draw(st.text(max_size=20)))


@settings(max_examples=60, deadline=None)
@given(st.lists(segments(), min_size=1, max_size=8), st.booleans())
def test_any_trajectory_round_trips_bit_for_bit(tmp_path_factory, segs, gz):
    t = Trajectory(segments=segs, steps=({"step": 0, "note": "é"},), reward={"task": 1.0})
    path = tmp_path_factory.mktemp("rt") / ("t.jsonl.gz" if gz else "t.jsonl")
    write_trajectories(path, [t])
    (back,) = read_trajectories(path)
    assert back == t
    assert [struct.pack("d", x) for x in back.logprobs] == [struct.pack("d", x) for x in t.logprobs]
    assert back.sources == t.sources and back.loss_mask == t.loss_mask


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"steps": "abc"}, "'steps' is 'abc'; expected list"),
        ({"sample_index": "x"}, "'sample_index' is 'x'; expected int"),
        ({"segments": [7]}, "segment 0: expected a JSON object, got int"),
        ({"segments": [{"source": "prompt", "token_ids": [1], "step": "7"}]}, "'step' is '7'"),
        (
            {"segments": [{"source": "policy", "token_ids": [1], "logprobs": "0"}]},
            "'logprobs' is '0'; expected list",
        ),
        (
            {"segments": [{"source": "policy", "token_ids": [1], "logprobs": [None]}]},
            "logprobs[0] is None, not a number",
        ),
    ],
)
def test_malformed_stored_values_are_named(tmp_path, patch, message):
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps({**_traj().to_dict(), **patch}) + "\n")
    with pytest.raises(TrajectoryError, match=r"m\.jsonl:1") as err:
        read_trajectories(path)
    assert message in str(err.value)


def test_a_receipts_dict_is_asdicts_and_shares_nothing_with_it():
    """`Receipt.to_dict` (every episode makes one per trajectory) is `dataclasses.asdict`'s
    result, field for field and type for type, and a copy: changing it changes no receipt."""
    import dataclasses

    from tracerl.types import Attribution
    from tracerl.types.episode import Receipt

    r = Receipt(
        replay_id="r",
        episode_id="e",
        env={"name": "x", "kwargs": {"k": [1, (2, 3)]}, "wrappers": [{"w": None}]},
        tool_versions={"t": "1"},
        tool_schemas=[{"name": "t", "parameters": {"type": "object"}}],
        task_id="1",
        task={"id": 1, "answers": ["7"], "pair": (1, 2)},
        seed=3,
        policy_version=None,
        model_id="m",
        template_hash="h",
        template_kwargs={},
        parser="json_list",
        side_effect_guard="dry_run",
        rollout={"budgets": {"steps": 1}},
        steps=[{"step": 0, "latency_ms": 1.5, "exception": None}],
        attribution=Attribution.POLICY,
        final_state={"rows": [[1, 2.5, True]]},
    )
    d = r.to_dict()
    assert d == dataclasses.asdict(r) and list(d) == [f.name for f in dataclasses.fields(r)]
    assert type(d["task"]["pair"]) is tuple and d["attribution"] is Attribution.POLICY
    d["env"]["kwargs"]["k"].append(9)
    d["task"]["answers"][0] = "8"
    d["final_state"]["rows"][0][0] = 0
    assert r.env["kwargs"]["k"] == [1, (2, 3)] and r.task["answers"] == ["7"]
    assert r.final_state == {"rows": [[1, 2.5, True]]}
