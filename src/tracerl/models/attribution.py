"""Attribution of a rendered delta: which characters are template scaffold, which are message
content (`environment`, `echo`, or `prompt` at a sample's start), and where the generation
prompt begins. Pure functions over strings, and the `Sentinels` whose render marks where each
message's content lies; the renders themselves happen in `Conversation`.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any

from tracerl.types import Source, ToolCall, TrajectoryError


class Sentinels:
    """Placeholders for message contents: letters and digits only, so they survive `| trim`,
    `| tojson` and HTML escaping, with a random nonce so no model or tool text can collide."""

    # Any conversation's sentinel, compiled once: a pattern per nonce cost a compile per
    # conversation and evicted the process's other patterns from `re`'s cache. Its nonce
    # and index cannot overlap another match (no letter of "TRACERL" is a lowercase hex
    # digit), so keeping only this nonce's matches splits as this nonce's own pattern would.
    _ANY = re.compile(r"TRACERL([0-9a-f]{12})X(\d+)Q")

    def __init__(self) -> None:
        self.nonce = secrets.token_hex(6)

    def __call__(self, index: int) -> str:
        return f"TRACERL{self.nonce}X{index}Q"

    def split(self, text: str) -> list[str]:
        """`text` cut at this nonce's sentinels: scaffold, index, scaffold, ..., scaffold
        (`re.split` of the sentinel pattern with its index captured)."""
        parts: list[str] = []
        start = 0
        for m in self._ANY.finditer(text):
            if m.group(1) == self.nonce:
                parts += [text[start : m.start()], m.group(2)]
                start = m.end()
        parts.append(text[start:])
        return parts


@dataclass(frozen=True)
class Piece:
    """A run of rendered text with one author, before tokenization."""

    text: str
    source: Source
    step: int
    tool_call_id: str | None = None
    content: bool = False  # message content: may never form control tokens


def split_delta(
    messages: list[dict[str, Any]], parts: list[str], target: str, step: int, *, prompt: bool
) -> list[Piece]:
    """Walk `parts` (scaffold, message index, scaffold, ..., scaffold — from splitting a
    sentinel render) against `target` (the real render), yielding scaffold and content pieces.
    Raises TrajectoryError when the two cannot be reconciled."""
    pieces: list[Piece] = []
    cursor = 0
    scaffold_source = Source.PROMPT if prompt else Source.TEMPLATE
    for k in range(0, len(parts), 2):
        scaffold = parts[k]
        if not target.startswith(scaffold, cursor):
            raise TrajectoryError(
                "renderer: the chat template changes message content while rendering it; "
                "cannot attribute its tokens"
            )
        pieces.append(Piece(scaffold, scaffold_source, step))
        cursor += len(scaffold)
        if k + 1 == len(parts):
            break
        msg = messages[int(parts[k + 1])]
        found = match_content(msg["content"], target, cursor, parts[k + 2])
        if found is None:
            raise TrajectoryError(
                f"renderer: could not place the content of message {parts[k + 1]} "
                f"({msg['role']}) in the rendered text; the template transforms it"
            )
        pieces.extend(content_pieces(msg, *found, step=step, prompt=prompt))
        cursor += len(found[0])
    if cursor != len(target):
        raise TrajectoryError("renderer: rendered text and attribution disagree")
    return pieces


def split_generation_prompt(pieces: list[Piece], gen: str | None, next_step: int) -> list[Piece]:
    """The generation prompt opens the next turn: `template` tokens of `next_step`.

    `gen` is None when the template does not simply append a generation prompt (Phi-3 prints
    an eos without it); then the whole closing scaffold opens the next turn, so a control
    token is never cut.
    """
    last = pieces[-1]
    if gen is None or not last.text.endswith(gen):
        gen = last.text
    head = last.text[: len(last.text) - len(gen)]
    return [
        *pieces[:-1],
        Piece(head, last.source, last.step),
        Piece(gen, Source.TEMPLATE, next_step),
    ]


def content_pieces(
    msg: dict[str, Any], text: str, form: str, *, step: int, prompt: bool
) -> list[Piece]:
    """A message's printed content: `prompt` at a sample's start; else `environment`, with a
    leading repeat of the model's own call split off as `echo`."""
    if prompt:
        return [Piece(text, Source.PROMPT, step, content=True)]
    call_id = msg.get("tool_call_id")
    echo = echo_prefix(msg)
    shown = printed_prefix(echo, msg["content"], form) if echo else ""
    if not text.startswith(shown):
        shown = ""
    out = []
    if shown:
        out.append(Piece(shown, Source.ECHO, step, call_id, content=True))
    out.append(Piece(text[len(shown) :], Source.ENVIRONMENT, step, call_id, content=True))
    return out


def echo_prefix(msg: dict[str, Any]) -> str:
    """The leading part of a tool message's content that repeats the model's own call, if any.

    Declared by the tool framework (`echo=`), or recognised as the exact text the model sampled
    for the call it answers (`ToolCall.raw`) or the call's canonical JSON.
    """
    content = msg["content"]
    declared = msg.get("_echo")
    if declared and content.startswith(declared):
        return declared
    call: ToolCall | None = msg.get("_call")
    if call is not None:
        canonical = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
        for form in (call.raw, canonical):
            if form and content.startswith(form):
                return form
    return ""


def match_content(content: str, target: str, cursor: int, following: str) -> tuple[str, str] | None:
    """How the template printed `content` at `cursor`: verbatim, whitespace-trimmed (Llama's
    ``| trim``) or JSON-escaped (Llama 3.x prints tool results with ``| tojson``; the quotes
    are scaffold), checked against the scaffold that follows. Returns (printed text, form)."""
    forms = {
        "verbatim": content,
        "strip": content.strip(),
        "lstrip": content.lstrip(),
        "rstrip": content.rstrip(),
        "json": json.dumps(content, ensure_ascii=False)[1:-1],
    }
    for form, printed in forms.items():
        end = cursor + len(printed)
        if target.startswith(printed, cursor) and target.startswith(following, end):
            return printed, form
    return None


def printed_prefix(prefix: str, content: str, form: str) -> str:
    """How the leading `prefix` of `content` appears once the template printed it in `form`."""
    if form == "json":
        return json.dumps(prefix, ensure_ascii=False)[1:-1]  # escaping is per character
    if form in ("strip", "lstrip"):
        prefix = prefix.lstrip()
    if prefix == content and form in ("strip", "rstrip"):
        prefix = prefix.rstrip()
    return prefix
