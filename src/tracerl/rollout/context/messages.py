"""A conversation's messages as a compaction sees them: clean copies, turns, new prompts.

`Conversation.messages` holds validated messages (a tool message knows the call it
answers); `clean` turns them back into what `Conversation.restart` accepts. A *turn* is a
model message and the messages that answered it, up to the next model message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Message = dict[str, Any]


def clean(m: Message, *, content: str | None = None) -> Message:
    """A message as `Conversation.restart` accepts it (with `content` instead, if given)."""
    out: Message = {"role": m["role"], "content": m["content"] if content is None else content}
    for key in ("name", "tool_call_id", "tool_calls"):
        if m.get(key) is not None:
            out[key] = m[key]
    if content is None and m.get("_echo") is not None:
        out["echo"] = m["_echo"]
    return out


def turns(messages: Sequence[Message]) -> list[list[int]]:
    """The indices of `messages` grouped by turn (each starts at a model message)."""
    out: list[list[int]] = []
    for i, m in enumerate(messages):
        if m["role"] == "assistant" or not out:
            out.append([])
        out[-1].append(i)
    return [t for t in out if messages[t[0]]["role"] == "assistant"]


def plain(messages: Sequence[Message]) -> list[dict[str, str]]:
    """Role and text only (what a summarizer outside the policy reads): a tool call is
    written out after its message's text."""
    out = []
    for m in messages:
        text = m["content"]
        calls = m.get("tool_calls") or ()
        if calls and not text.strip():
            text = "\n".join(f"[called {c.name}({c.arguments})]" for c in calls)
        out.append({"role": m["role"], "content": text})
    return out
