"""The gateway's other protocols: an unmodified Anthropic-SDK agent (Messages) and an
openai-SDK agent on the Responses API give token for token the episode tracerl's own
runner makes; history rewrites in each protocol are recorded breaks; what the gateway
cannot render is refused, never dropped. Agents: `tests/harnesses.py` (no tracerl import)."""

from __future__ import annotations

import pytest

from tests.unit.test_gateway import (
    CALL,
    assert_same_tokens,
    native,
    sampled_only,
    scripted,
    via_gateway,
)
from tracerl.gateway import messages, responses
from tracerl.gateway.chat import GatewayError
from tracerl.models import load
from tracerl.types import Attribution, Source, StopReason

pytest.importorskip("anthropic")

LOOPS = [
    ("tests.harnesses:anthropic_loop", "anthropic-messages"),
    ("tests.harnesses:anthropic_streaming", "anthropic-messages"),
    ("tests.harnesses:responses_chained", "openai-responses"),
    ("tests.harnesses:responses_stateless", "openai-responses"),
]


@pytest.fixture(scope="module")
def bundle():
    return load("tiny-random")


@pytest.mark.parametrize(("entry", "protocol"), LOOPS)
def test_each_protocols_tool_loop_is_token_identical_to_native(bundle, entry, protocol):
    turns = {0: CALL, 1: "The sum is 5."}
    ours = via_gateway(entry, scripted(bundle, turns))
    theirs = native(scripted(bundle, turns))
    assert ours.stop_reason is theirs.stop_reason is StopReason.ANSWERED, ours.receipt.error
    assert ours.attribution is Attribution.POLICY and ours.gradient_eligible
    assert_same_tokens(ours, theirs)
    t = ours.trajectories[0]
    env_text = "".join(s.text for s in t.segments if s.source is Source.ENVIRONMENT)
    assert env_text == "5"  # the tool result, the environment's: no loss
    assert ours.steps[-1]["info"]["answer"] == "The sum is 5."
    assert ours.steps[0]["calls"][0]["action"] == {"tool": "add", "args": {"a": 2, "b": 3}}
    agent = ours.receipt.agent
    assert agent["protocols"] == [protocol]
    assert agent["requests"] == 2 and agent["history_breaks"] == []


def test_sdk_fields_that_change_nothing_are_listed_in_the_receipt(bundle):
    ours = via_gateway("tests.harnesses:anthropic_loop", scripted(bundle, {0: CALL, 1: "5"}))
    # the anthropic loop sends model and max_tokens only: nothing ignored
    assert ours.receipt.agent["ignored_params"] == []
    chat, ignored = messages.read_request(
        {
            "model": "m", "max_tokens": 9, "temperature": 0.2, "top_k": 5,
            "metadata": {"user_id": "u"},
            "system": [{"type": "text", "text": "S", "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": "hi"}],
        }
    )  # fmt: skip
    assert ignored == {"temperature", "top_k", "metadata", "cache_control"}
    assert chat == {
        "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}],
        "max_tokens": 9,
    }
    chat, _, ignored = responses.read_request(
        {"model": "m", "input": "hi", "temperature": 0.1, "reasoning": {"effort": "low"},
         "parallel_tool_calls": True, "max_output_tokens": 7},
        {},
    )  # fmt: skip
    assert ignored == {"temperature", "reasoning", "parallel_tool_calls"}
    assert chat == {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 7}


# ---- rewrites: a break per case --------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "turns", "differs"),
    [
        ("tests.harnesses:anthropic_edits_result", {0: CALL, 1: "5"}, "(tool) content changed"),
        ("tests.harnesses:anthropic_drops_message", {0: CALL, 1: "5"}, "message 2 was"),
        (
            "tests.harnesses:anthropic_changes_system",
            {0: CALL, 1: "5"},
            "message 0 (system) content changed",
        ),
        ("tests.harnesses:responses_drops_item", {0: CALL, 1: "5"}, "message 2 was 'assistant'"),
        ("tests.harnesses:responses_edits_output", {0: CALL, 1: "5"}, "(tool) content changed"),
        ("tests.harnesses:responses_goes_back", {0: CALL, 1: "5"}, "message 4 was 'assistant'"),
        (
            "tests.harnesses:responses_changes_instructions",
            {0: CALL, 1: "5"},
            "message 0 (system) content changed",
        ),
    ],
)
def test_history_rewrites_in_each_protocol_are_recorded_breaks(bundle, entry, turns, differs):
    episode = via_gateway(entry, scripted(bundle, turns))
    assert episode.stop_reason is StopReason.ANSWERED, episode.receipt.error
    breaks = episode.receipt.agent["history_breaks"]
    assert len(breaks) == 1 and differs in breaks[0]["reason"], breaks
    assert len(episode.trajectories) == 2
    assert episode.trajectories[1].segments[0].source is Source.PROMPT
    sampled_only(episode)


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ("tests.harnesses:anthropic_sends_an_image", "'image' block"),
        ("tests.harnesses:responses_sends_reasoning", "'reasoning' item"),
        ("tests.harnesses:responses_unknown_id", "no response of this session"),
    ],
)
def test_what_cannot_be_rendered_is_refused_not_dropped(bundle, entry, says):
    episode = via_gateway(entry, scripted(bundle, {0: "5"}))
    # the harness got a 400 and raised: its own doing, the environment's; nothing trained
    assert episode.stop_reason is StopReason.AGENT_ERROR
    assert episode.attribution is Attribution.ENVIRONMENT and not episode.gradient_eligible
    assert says in episode.receipt.error


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
        {"messages": [{"role": "assistant", "content": [{"type": "thinking", "thinking": "x"}]}]},
        {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "bash_20250124",
                                                                    "name": "bash"}]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "x",
                                                    "citations": [{"cited_text": "y"}]}]}]},
    ],
)  # fmt: skip
def test_anthropic_blocks_and_tools_it_cannot_render_are_refused(body):
    with pytest.raises(GatewayError) as e:
        messages.read_request({"model": "m", "max_tokens": 5, **body})
    assert e.value.status == 400


@pytest.mark.parametrize(
    "body",
    [
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
        {"input": [{"type": "item_reference", "id": "msg_1"}]},
        {"input": "x", "tools": [{"type": "web_search"}]},
        {"input": "x", "conversation": "conv_1"},
        {"input": "x", "background": True},
    ],
)
def test_responses_items_and_tools_it_cannot_render_are_refused(body):
    with pytest.raises(GatewayError) as e:
        responses.read_request({"model": "m", **body}, {})
    assert e.value.status == 400


def test_a_responses_stream_answers_the_same_text(bundle):
    ours = via_gateway("tests.harnesses:responses_streaming", scripted(bundle, {0: "It is 5."}))
    assert ours.stop_reason is StopReason.ANSWERED, ours.receipt.error
    assert ours.steps[-1]["info"]["answer"] == "It is 5."


def test_anthropic_tool_results_then_text_keep_their_order():
    chat, _ = messages.read_request(
        {
            "model": "m", "max_tokens": 5,
            "messages": [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Let me add."},
                    {"type": "tool_use", "id": "t1", "name": "add", "input": {"a": 1}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": [
                        {"type": "text", "text": "2"}]},
                    {"type": "text", "text": "and now?"},
                ]},
            ],
        }
    )  # fmt: skip
    assert chat["messages"] == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "Let me add.",
         "tool_calls": [{"id": "t1", "name": "add", "arguments": {"a": 1}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "2"},
        {"role": "user", "content": "and now?"},
    ]  # fmt: skip


@pytest.mark.parametrize("entry", [e for e, _ in LOOPS])
def test_an_unparseable_turn_is_plain_text_and_the_policys_in_every_protocol(bundle, entry):
    broken = '<tool_call>[{"name": "add", "arguments": {"a": 2</tool_call>'
    episode = via_gateway(entry, scripted(bundle, {0: broken}))
    assert episode.stop_reason is StopReason.ANSWERED, episode.receipt.error
    assert episode.steps[-1]["info"]["answer"] == broken  # given back as text, no call
    step = episode.steps[0]
    assert step["policy_error"] and step["fault"]["kind"] == "parse_error"
    assert step["response"]["tool_calls"] == []
