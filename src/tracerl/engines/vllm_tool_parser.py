"""A vLLM tool-call parser for tracerl's ``json_list`` format, as a ``--tool-parser-plugin``.

SmolLM2-style policies (``env.parser: json_list``) call tools with a JSON list inside one
block: ``<tool_call>[{"name": ..., "arguments": {...}}, ...]</tool_call>``. vLLM's built-in
``hermes`` parser reads one JSON object per block and returns such a turn as plain content.
`tracerl export` copies this file into the exported folder, so the folder serves with::

    vllm serve DIR --enable-auto-tool-choice \\
        --tool-parser-plugin DIR/tracerl_tool_parser.py --tool-call-parser tracerl_json_list

It runs inside vLLM's own environment (it imports vLLM; tracerl never imports it) and reads
calls by the rules of `tracerl.envs.parsers.JsonListParser`: every ``<tool_call>`` block holds
a JSON list of calls or one call, each ``{"name": str, "arguments": object}`` (arguments may
be a JSON string of an object). A turn whose blocks do not all read is content, not calls.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from vllm.entrypoints.generate.base.protocol import (
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    ExtractedToolCallInformation,
    FunctionCall,
    ToolCall,
)
from vllm.renderers.chat_utils import make_tool_call_id
from vllm.tool_parsers.abstract_tool_parser import ToolParser, ToolParserManager

NAME = "tracerl_json_list"
OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def parse_calls(text: str) -> list[tuple[str, dict[str, Any]]] | None:
    """The calls `text` makes, in order; None when it makes none or a block does not read."""
    calls: list[tuple[str, dict[str, Any]]] = []
    for block in _BLOCK.finditer(text):
        try:
            value = json.loads(block.group(1).strip())
        except (json.JSONDecodeError, RecursionError):
            return None
        for item in value if isinstance(value, list) else [value]:
            if not isinstance(item, dict):
                return None
            name, args = item.get("name"), item.get("arguments", {})
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except json.JSONDecodeError:
                    return None
            if not isinstance(name, str) or not name or not isinstance(args, dict):
                return None
            calls.append((name, args))
    return calls or None


def content_of(text: str) -> str | None:
    """`text` without its calls (what an answer carries beside them); None when empty."""
    return _BLOCK.sub("", text).strip() or None


class TracerlJsonListToolParser(ToolParser):
    """``<tool_call>[...]</tool_call>`` calls, whole turns and streamed."""

    def __init__(self, tokenizer: Any, tools: Any = None) -> None:
        super().__init__(tokenizer, tools)
        self._sent_content = 0
        self._sent_calls = 0

    def adjust_request(self, request: Any) -> Any:
        request = super().adjust_request(request)
        if request.tools and request.tool_choice != "none":
            request.skip_special_tokens = False  # the tags may be special tokens
        return request

    def extract_tool_calls(self, model_output: str, request: Any) -> ExtractedToolCallInformation:
        calls = parse_calls(model_output)
        if not calls:
            return ExtractedToolCallInformation(
                tools_called=False, tool_calls=[], content=model_output
            )
        return ExtractedToolCallInformation(
            tools_called=True,
            tool_calls=[
                ToolCall(
                    type="function",
                    function=FunctionCall(
                        name=name, arguments=json.dumps(args, ensure_ascii=False)
                    ),
                )
                for name, args in calls
            ],
            content=content_of(model_output),
        )

    def extract_tool_calls_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
        request: Any,
    ) -> DeltaMessage | None:
        """Content up to the first ``<tool_call>`` as it arrives (holding back what may be
        the start of the tag); each call once its block has closed, whole."""
        at = current_text.find(OPEN)
        if at < 0:
            at = len(current_text)
            for k in range(min(len(OPEN) - 1, len(current_text)), 0, -1):
                if current_text.endswith(OPEN[:k]):
                    at -= k
                    break
        content = current_text[self._sent_content : at] if at > self._sent_content else ""
        self._sent_content = max(self._sent_content, at)
        end = current_text.rfind(CLOSE)
        closed = current_text[: end + len(CLOSE)] if end >= 0 else ""
        calls = parse_calls(closed) or []
        deltas = []
        for i in range(self._sent_calls, len(calls)):
            name, args = calls[i]
            arguments = json.dumps(args, ensure_ascii=False)
            self.prev_tool_call_arr.append({"name": name, "arguments": args})
            self.streamed_args_for_tool.append(arguments)
            deltas.append(
                DeltaToolCall(
                    index=i,
                    id=make_tool_call_id(),
                    type="function",
                    function=DeltaFunctionCall(name=name, arguments=arguments),
                )
            )
        self._sent_calls = max(self._sent_calls, len(calls))
        self.current_tool_id = self._sent_calls - 1
        if not content and not deltas:
            return None
        return DeltaMessage(content=content or None, tool_calls=deltas)


ToolParserManager.register_module(NAME, module=TracerlJsonListToolParser)
