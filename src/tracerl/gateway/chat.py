"""The OpenAI chat-completions wire format, as the gateway reads and answers it.

Requests are normalized into tracerl's message form before anything is compared or
rendered: ``developer`` is ``system``; content given as a list of text parts is the parts
joined by newlines (vLLM's string form); an assistant message's ``tool_calls`` become
``{"id", "name", "arguments"}`` with the arguments parsed; fields the template never sees
(``refusal``, ``audio``, ``annotations`` ...) are dropped. Two messages are the same message
exactly when their normalized forms are equal: this is what decides whether a request
extends a session's history or rewrites it.

A request asks for one answer (``n`` 1) to messages that end with a user or tool message.
Its sampling parameters (`SAMPLING_FIELDS`) are the run's to decide: recorded as ignored,
never applied; `ASKED` fields are recorded with the step (exact replay sends them again).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from typing import Any

from tracerl.types import ToolCall, TrajectoryError

ROLES = ("system", "user", "assistant", "tool")

# request fields that would change sampling, which the run's sampler decides
SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "response_format",
    "reasoning_effort",
)

# request fields the step records (exact replay sends them again)
ASKED = ("tool_choice", "max_tokens", "max_completion_tokens")


class GatewayError(Exception):
    """A request the gateway answers with an error (OpenAI's error body)."""

    def __init__(self, status: int, message: str, code: str = "invalid_request") -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "code": self.code}}


def _content(value: Any, where: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for j, part in enumerate(value):
            if not isinstance(part, dict) or part.get("type") not in ("text", "input_text"):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise GatewayError(
                    400, f"{where}: content part {j} is {kind!r}; only text parts are supported"
                )
            texts.append(str(part.get("text", "")))
        return "\n".join(texts)
    raise GatewayError(400, f"{where}: content must be a string or a list of text parts")


def tool_call(raw: Any, where: str) -> dict[str, Any]:
    """An OpenAI tool call (``{"id", "type", "function": {"name", "arguments"}}``, the
    arguments a JSON string) in tracerl's form."""
    try:
        call = ToolCall.from_dict(raw)
    except TrajectoryError as e:
        raise GatewayError(400, f"{where}: {e}") from None
    return {"id": call.id, "name": call.name, "arguments": call.arguments}


def parse_arguments(value: Any, where: str) -> dict[str, Any]:
    """A tool call's arguments (a JSON object, or a string holding one) as a dict."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except json.JSONDecodeError as e:
            raise GatewayError(
                400, f"{where}: the arguments are not valid JSON ({e.msg})"
            ) from None
    if not isinstance(value, dict):
        raise GatewayError(400, f"{where}: the arguments must be a JSON object")
    return value


def normalize_messages(raw: Any) -> list[dict[str, Any]]:
    """Request messages in tracerl's form, or a 400 naming the message at fault."""
    if not isinstance(raw, list) or not raw:
        raise GatewayError(400, "messages must be a non-empty list")
    out = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise GatewayError(400, f"{where}: expected an object with 'role' and 'content'")
        role = "system" if m.get("role") == "developer" else m.get("role")
        if role not in ROLES:
            raise GatewayError(400, f"{where}: unknown role {m.get('role')!r}")
        msg: dict[str, Any] = {"role": role, "content": _content(m.get("content"), where)}
        if role == "tool":
            if not isinstance(m.get("tool_call_id"), str):
                raise GatewayError(400, f"{where}: a tool message needs its tool_call_id")
            msg["tool_call_id"] = m["tool_call_id"]
        if role == "assistant" and m.get("tool_calls"):
            if not isinstance(m["tool_calls"], list):
                raise GatewayError(400, f"{where}: tool_calls must be a list")
            msg["tool_calls"] = [
                tool_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(m["tool_calls"])
            ]
        if isinstance(m.get("name"), str) and m["name"]:
            msg["name"] = m["name"]
        out.append(msg)
    return out


def tool_list(raw: Any) -> list[Any] | None:
    """A request's ``tools`` in any protocol: None when absent or empty, else the list."""
    if raw is None or raw == []:
        return None
    if not isinstance(raw, list):
        raise GatewayError(400, "tools must be a list")
    return raw


class FieldReader:
    """One request of another protocol read into this form (`tracerl.gateway.messages`,
    `tracerl.gateway.responses`): the fields it ignores, and its text parts. `empty_ok`:
    fields that may come back empty (an SDK echoing its own blocks) and are refused when not
    (they cannot be rendered)."""

    empty_ok: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.ignored: set[str] = set()

    def note(self, item: dict[str, Any], known: tuple[str, ...], where: str, label: str) -> None:
        """Record `item`'s fields other than `known` as ignored (``label.field``)."""
        for key, value in item.items():
            if key in known or (key in self.empty_ok and not value):
                continue
            if key in self.empty_ok:
                raise GatewayError(400, f"{where}.{key}: not supported (it cannot be rendered)")
            self.ignored.add(key if key == "cache_control" else f"{label}.{key}")

    def texts(self, value: Any, where: str, kinds: tuple[str, ...], word: str) -> str:
        """A string, or a list of text parts (of `kinds`) joined by newlines; anything else
        is refused (fail-closed)."""
        if isinstance(value, str):
            return value
        if not isinstance(value, list):
            raise GatewayError(400, f"{where}: expected a string or a list of text {word}s")
        out = []
        for j, part in enumerate(value):
            at = f"{where}[{j}]"
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            if kind not in kinds:
                raise GatewayError(400, f"{at}: a {kind!r} {word}; only text {word}s are supported")
            self.note(part, ("type", "text"), at, self.label(at, kind))
            out.append(str(part.get("text", "")))
        return "\n".join(out)

    def label(self, where: str, kind: str) -> str:
        """How an ignored field of the part at `where` (of type `kind`) is named."""
        return kind


def normalize_tools(raw: Any) -> list[dict[str, Any]] | None:
    """The request's ``tools`` (function tools only), as the chat template renders them."""
    raw = tool_list(raw)
    if raw is None:
        return None
    out = []
    for i, t in enumerate(raw):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict) or t.get("type", "function") != "function" or "name" not in fn:
            raise GatewayError(400, f"tools[{i}]: expected {{'type': 'function', 'function': ...}}")
        out.append({"type": "function", "function": fn})
    return out


def read_request(body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """A request's messages and tools, normalized; refused when it asks for more than one
    answer or ends with the assistant's own message."""
    if body.get("n") not in (None, 1):
        raise GatewayError(400, "n must be 1: one answer per request (run a group instead)")
    messages = normalize_messages(body.get("messages"))
    tools = normalize_tools(body.get("tools"))
    if messages[-1]["role"] == "assistant":
        raise GatewayError(
            400,
            "the last message is the assistant's: continuing an assistant message is not "
            "supported; end the request with a user or tool message",
        )
    return messages, tools


def ignored_fields(body: dict[str, Any]) -> set[str]:
    """The request's sampling parameters, which the run's sampler decides instead."""
    return {k for k in SAMPLING_FIELDS if body.get(k) is not None}


def asked_fields(body: dict[str, Any]) -> dict[str, Any]:
    """What the step records of the request besides its messages (`ASKED`)."""
    return {k: body[k] for k in ASKED if body.get(k) is not None}


def asked_max_tokens(body: dict[str, Any]) -> int | None:
    """The request's token limit for the answer (``max_completion_tokens`` or
    ``max_tokens``), if it gives one."""
    asked = body.get("max_completion_tokens") or body.get("max_tokens")
    if asked is not None and (not isinstance(asked, int) or asked < 1):
        raise GatewayError(400, f"max_tokens must be a positive integer, not {asked!r}")
    return asked


def tool_version(tool: dict[str, Any]) -> str:
    """A tool's version in receipts: the hash of its schema (the harness runs the tool)."""
    blob = json.dumps(tool, sort_keys=True, ensure_ascii=False).encode()
    return "schema:" + hashlib.sha256(blob).hexdigest()[:12]


def first_difference(
    history: Sequence[dict[str, Any]], messages: Sequence[dict[str, Any]]
) -> str | None:
    """Where `messages` stops extending `history`, in words; None if it extends it.
    Messages are compared normalized (tool-call arguments as parsed JSON)."""
    for i, (old, new) in enumerate(zip(history, messages, strict=False)):
        if old == new:
            continue
        if old["role"] != new["role"]:
            return f"message {i} was {old['role']!r}, is now {new['role']!r}"
        for key in ("content", "tool_calls", "tool_call_id", "name"):
            if old.get(key) != new.get(key):
                before, after = _show(old.get(key)), _show(new.get(key))
                return f"message {i} ({old['role']}) {key} changed: {before} became {after}"
    if len(messages) < len(history):
        return (
            f"the request has {len(messages)} messages, the session's history {len(history)}: "
            f"message {len(messages)} ({history[len(messages)]['role']}) was dropped"
        )
    return None


def _show(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return repr(text[:60] + ("..." if len(text) > 60 else ""))


def completion_body(
    cid: str,
    model: str,
    message: dict[str, Any],
    finish_reason: str,
    usage: dict[str, int],
    extra: dict[str, Any],
) -> dict[str, Any]:
    """A ``chat.completion`` object."""
    return {
        "id": cid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}
        ],
        "usage": usage,
        **extra,
    }


def stream_chunks(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The same answer as ``chat.completion.chunk`` events (the whole turn is sampled before
    it is sent: a role chunk, the content, the tool calls, the finish reason, the usage)."""
    choice = body["choices"][0]
    msg = choice["message"]
    head = {k: body[k] for k in ("id", "created", "model")}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        c = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        return {**head, "object": "chat.completion.chunk", "choices": [c]}

    out = [chunk({"role": "assistant", "content": ""})]
    if msg.get("content"):
        out.append(chunk({"content": msg["content"]}))
    if msg.get("tool_calls"):
        calls = [{"index": i, **c} for i, c in enumerate(msg["tool_calls"])]
        out.append(chunk({"tool_calls": calls}))
    out.append(chunk({}, choice["finish_reason"]))
    out.append({**head, "object": "chat.completion.chunk", "choices": [], "usage": body["usage"]})
    return out


def openai_tool_calls(calls: Sequence[ToolCall]) -> list[dict[str, Any]]:
    return [
        {
            "id": c.id,
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)},
        }
        for c in calls
    ]
