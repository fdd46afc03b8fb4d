"""A gateway session's history: whether a request extends it or rewrites it, and the
messages as the session's conversation renders them.

A request *extends* the session when its messages start with exactly the session's history
(the earlier request's messages, then the assistant message the gateway answered, as the
harness echoes it back); the new messages after that are an observation. Anything else is a
*rewrite*: a message dropped, edited or reordered, the model's reasoning stripped from an
earlier answer, the system prompt or the tools changed, a request repeated without its
answer (a retry or a resample). `rewrite_reason` says which, in words; the session then
records a break and starts a new sample (`tracerl.gateway.session`). `compaction` says
whether the rewrite is a harness compacting its own history (a run of earlier messages
replaced by a summary), so the break is classified and counted as one.

Messages are compared normalized (`tracerl.gateway.chat`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from tracerl.gateway.chat import first_difference
from tracerl.types import ToolCall


def rewrite_reason(
    history: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    awaiting_observation: bool,
    messages: list[dict[str, Any]],
    new_tools: list[dict[str, Any]] | None,
) -> str | None:
    """Why `messages` (with `new_tools`) does not extend `history` (offered `tools`; the
    model's last turn `awaiting_observation`); None when it does."""
    if new_tools != tools:
        return "the tools changed"
    diff = first_difference(history, messages)
    if diff is not None:
        return diff
    new = messages[len(history) :]
    if awaiting_observation and not new:
        return "the request repeats the last one without its answer (a retry or resample)"
    if not awaiting_observation and new:
        return "the previous request got no answer, and the harness went on without it"
    for i, m in enumerate(new, start=len(history)):
        if m["role"] == "assistant":
            return f"message {i} is an assistant message the model did not sample"
    return None


def compaction(history: list[dict[str, Any]], messages: list[dict[str, Any]]) -> str | None:
    """Whether `messages` compacts `history`: it keeps the history's first messages (at
    least one), then one or two new messages that are not tool results (the summary), then,
    optionally, the history's last messages as they were, and new messages that are not
    the assistant's; and it replaces at least two of the history's messages. Where, in
    words, or None when it is not recognized as one (any other rewrite)."""
    p = 0
    while p < min(len(history), len(messages)) and history[p] == messages[p]:
        p += 1
    if p == 0 or len(history) - p < 2:
        return None
    for k in (1, 2):
        summary, rest = messages[p : p + k], messages[p + k :]
        if len(summary) < k or any(
            m in history or not m.get("content") or m["role"] == "tool" for m in summary
        ):  # a summary is new text, never a tool's result
            continue
        for m in range(p + 2, len(history) + 1):  # history[p:m] replaced, history[m:] kept
            kept = history[m:]
            if rest[: len(kept)] == kept and all(
                x["role"] != "assistant" for x in rest[len(kept) :]
            ):
                return (
                    f"compaction: messages {p}-{m - 1} of the history replaced by "
                    f"{k} summary message{'s' if k > 1 else ''}"
                )
    return None


def message_key(message: dict[str, Any]) -> str:
    """A normalized message as a key (an answer the gateway gave, as the harness echoes it)."""
    return json.dumps(message, sort_keys=True, ensure_ascii=False)


def for_template(
    messages: Sequence[dict[str, Any]], sampled: dict[str, str], parser: Any
) -> list[dict[str, Any]]:
    """Messages as the conversation takes them: an answer the gateway gave is rendered
    from the text the model sampled for it (`sampled`, by `message_key`; its calls in the
    model's own format); an assistant message the harness wrote gets its calls in that
    format too (`parser`)."""
    out = []
    for m in messages:
        if m["role"] == "assistant":
            text = sampled.get(message_key(m))
            if text is None:
                calls = [(c["name"], c["arguments"]) for c in m.get("tool_calls", [])]
                fmt = parser.format_calls(calls) if calls else ""
                text = "\n".join(t for t in (m["content"], fmt) if t)
            m = {**m, "content": text}
        out.append(m)
    return out


def named_tool_results(
    new: list[dict[str, Any]], open_calls: dict[str, ToolCall]
) -> list[dict[str, Any]]:
    """The observation's messages, each tool result named after the call it answers (when
    the harness left the name out)."""
    return [
        {**m, "name": open_calls[m["tool_call_id"]].name}
        if m["role"] == "tool" and "name" not in m and m["tool_call_id"] in open_calls
        else m
        for m in new
    ]
