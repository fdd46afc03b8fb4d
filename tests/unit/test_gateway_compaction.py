"""A harness that compacts its own history (a run of earlier messages replaced by a
summary) gets its break classified as ``compaction``, counted on the dashboard; any other
rewrite stays a plain ``rewrite``."""

from __future__ import annotations

import pytest

from tests.unit.test_gateway import CALL, scripted, via_gateway
from tracerl.gateway.history import compaction
from tracerl.models import load
from tracerl.rollout.groups import rollout_metrics
from tracerl.types import StopReason

S = {"role": "system", "content": "sys"}
U = {"role": "user", "content": "q"}
A1 = {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "name": "f", "arguments": {}}]}
T1 = {"role": "tool", "tool_call_id": "c", "content": "5"}
A2 = {"role": "assistant", "content": "five"}
U2 = {"role": "user", "content": "and then?"}
A3 = {"role": "assistant", "content": "six"}
SUM = {"role": "user", "content": "Summary: f gave 5."}
HISTORY = [S, U, A1, T1, A2, U2, A3]


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        ([S, U, SUM, {"role": "user", "content": "go on"}], "messages 2-6"),
        ([S, U, SUM, U2, A3, {"role": "user", "content": "go on"}], "messages 2-4"),
        ([S, SUM, {"role": "assistant", "content": "ok"}, A3], "messages 1-5"),  # summary, ack
        ([S, SUM, {"role": "assistant", "content": "ok"}, A2], None),  # kept ≠ a suffix
        ([S, U, A1, T1, {"role": "tool", "tool_call_id": "c", "content": "6"}], None),
        ([U, SUM], None),  # the first message dropped: not a compaction
        ([S, U, A1, T1, A2, SUM, A3], None),  # one message replaced: an edit
    ],
)
def test_compaction_is_recognized_only_where_it_is_one(messages, expected):
    got = compaction(HISTORY, messages)
    assert (got is None) if expected is None else (expected in got), got


@pytest.fixture(scope="module")
def bundle():
    return load("tiny-random")


def test_a_compacting_harness_gets_a_compaction_break_and_a_rate(bundle):
    episode = via_gateway("tests.harnesses:compacts", scripted(bundle, {0: CALL, 1: "5"}))
    assert episode.stop_reason is StopReason.ANSWERED, episode.receipt.error
    [b] = episode.receipt.agent["history_breaks"]
    assert b["kind"] == "compaction" and "messages 2-4" in b["compaction"], b
    edited = via_gateway("tests.agents:edits_tool_output", scripted(bundle, {0: CALL, 1: "5"}))
    assert [b["kind"] for b in edited.receipt.agent["history_breaks"]] == ["rewrite"]
    m = rollout_metrics([episode, edited])
    assert m["agent/history_break_rate"] == 1.0 and m["agent/compaction_rate"] == 0.5
