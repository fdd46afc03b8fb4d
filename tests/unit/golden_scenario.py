"""The multi-turn scenario every golden template test renders (imported by the tests)."""

from __future__ import annotations

from tracerl.models import ChatRenderer, Conversation
from tracerl.types import ToolCall

SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search an encyclopedia.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}},
            "required": ["query"],
        },
    },
}
MESSAGES = [
    {"role": "system", "content": "You answer with the help of a search tool."},
    {"role": "user", "content": "Who wrote Hamlet?"},
]
# How each family writes a tool call (the text the model samples).
CALL_TEXT = {
    "smollm2": '<tool_call>[{"name": "search", "arguments": {"query": "Hamlet"}}]</tool_call>',
    "qwen2_5": '<tool_call>\n{"name": "search", "arguments": {"query": "Hamlet"}}\n</tool_call>',
    "qwen3": '<tool_call>\n{"name": "search", "arguments": {"query": "Hamlet"}}\n</tool_call>',
    "llama3_2": '{"name": "search", "parameters": {"query": "Hamlet"}}',
}
MALFORMED = {
    "smollm2": '<tool_call>[{"name": "search", "arguments": {"query": </tool_call>',
    "qwen2_5": '<tool_call>\n{"name": "search", "arguments": {"query": \n</tool_call>',
    "qwen3": '<tool_call>\n{"name": "search", "arguments": {"query": \n</tool_call>',
    "llama3_2": '{"name": "search", "parameters": {"query": ',
}
THINK = {"qwen3": "<think>\nI should look this up.\n</think>\n\n"}
RESULT = "Hamlet is a tragedy written by William Shakespeare."
CUT = "The author of Hamlet is William"


def encode(renderer: ChatRenderer, text: str) -> list[int]:
    return renderer.tokenizer(text, add_special_tokens=False)["input_ids"]


def run(renderer: ChatRenderer, family: str) -> tuple[Conversation, list[list[int]]]:
    """Tool call, tool result, malformed call, error turn, empty turn, nudge, cut-off turn.

    Returns the conversation and the token ids the (scripted) sampler produced per turn.
    """
    eos = renderer.tokenizer.eos_token_id
    conv = renderer.start(MESSAGES, tools=[SEARCH_TOOL], episode_id=f"golden-{family}")
    think = THINK.get(family, "")
    sampled: list[list[int]] = []

    def policy(ids: list[int], **kw) -> None:
        sampled.append(ids)
        conv.add_policy(ids, [-0.25] * len(ids), **kw)

    call = ToolCall("call_0", "search", {"query": "Hamlet"}, raw=CALL_TEXT[family])
    policy([*encode(renderer, think + CALL_TEXT[family]), eos], tool_calls=[call])
    conv.add_observation([{"role": "tool", "tool_call_id": "call_0", "content": RESULT}])
    policy([*encode(renderer, think + MALFORMED[family]), eos])  # parses to no call
    conv.add_observation(
        [{"role": "user", "content": "Your tool call could not be parsed. Answer directly."}]
    )
    policy([eos])  # an empty model turn
    conv.add_observation([{"role": "user", "content": "Please answer."}])
    policy(encode(renderer, CUT), finish_reason="length")  # cut by the token limit
    return conv, sampled
