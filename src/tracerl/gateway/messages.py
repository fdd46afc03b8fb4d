"""Anthropic's Messages API (``POST /v1/messages``), as the gateway reads and answers it.

A request is translated into the chat-completions form the session core records
(`tracerl.gateway.chat`), and the core's answer back into a ``message``:

* ``system`` (a string or text blocks) is the system message;
* a user message's ``text`` blocks are a user message, its ``tool_result`` blocks tool
  messages (in their order: results first, as Anthropic requires, then text);
* an assistant message's ``text`` and ``tool_use`` blocks are one assistant message with
  its tool calls (``input`` is the call's arguments);
* ``tools`` (``name``, ``description``, ``input_schema``) are function tools;
  ``tool_choice`` ``none``/``auto``/``any``/``tool`` is chat's ``none``/``auto``/
  ``required``/named (only ``none`` changes anything: nothing constrains sampling);
* ``max_tokens`` (required by Anthropic) can only lower ``rollout.max_turn_tokens``.

Fail-closed: a content block the gateway cannot render exactly (images, documents,
thinking, server tools and their results, search results) or a server-side tool is refused
(400, naming where); every request field that changes nothing (sampling parameters,
``metadata``, ``cache_control`` ...) is recorded in the receipt (``ignored_params``).

The answer's ``content`` is a ``text`` block (what the model wrote besides its calls) and a
``tool_use`` block per call; ``stop_reason`` is ``tool_use``, ``max_tokens`` or
``end_turn``. ``stream: true`` gets the same answer as Anthropic's server-sent events.
"""

from __future__ import annotations

from typing import Any

from tracerl.gateway.chat import FieldReader, GatewayError, parse_arguments, tool_list

PROTOCOL = "anthropic-messages"
ROUTES = ("/v1/messages", "/messages")

# top-level request fields read here; every other one is recorded as ignored
READ = ("model", "messages", "system", "tools", "tool_choice", "max_tokens", "stream")
TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}
STOP = {"tool_calls": "tool_use", "length": "max_tokens", "stop": "end_turn"}
# block fields that may be present and empty (the SDK echoes its own blocks back)
EMPTY_OK = ("citations", "caller", "toolset_name")


def error_body(e: GatewayError) -> dict[str, Any]:
    kind = {401: "authentication_error", 404: "not_found_error", 409: "invalid_request_error"}
    name = kind.get(e.status, "invalid_request_error" if e.status < 500 else "api_error")
    return {"type": "error", "error": {"type": name, "message": e.message}}


class _Reader(FieldReader):
    """One Messages request's translation, collecting the fields it ignores."""

    empty_ok = EMPTY_OK

    def label(self, where: str, kind: str) -> str:
        return where.split("[")[0]

    def note(
        self, block: dict[str, Any], known: tuple[str, ...], where: str, label: str = ""
    ) -> None:
        super().note(block, known, where, label or self.label(where, ""))

    def text_blocks(self, value: Any, where: str) -> str:
        return self.texts(value, where, ("text",), "block")

    def tool_result(self, block: dict[str, Any], where: str) -> dict[str, Any]:
        if not isinstance(block.get("tool_use_id"), str):
            raise GatewayError(400, f"{where}: a tool_result needs its tool_use_id")
        self.note(block, ("type", "tool_use_id", "content", "is_error"), where)
        if block.get("is_error"):
            self.ignored.add("tool_result.is_error")  # the result's text is what renders
        content = self.text_blocks(block.get("content") or "", f"{where}.content")
        return {"role": "tool", "tool_call_id": block["tool_use_id"], "content": content}

    def user(self, content: Any, where: str) -> list[dict[str, Any]]:
        if isinstance(content, str):
            return [{"role": "user", "content": content}]
        if not isinstance(content, list):
            raise GatewayError(400, f"{where}.content: expected a string or a list of blocks")
        out: list[dict[str, Any]] = []
        for j, block in enumerate(content):
            at = f"{where}.content[{j}]"
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "tool_result":
                out.append(self.tool_result(block, at))
            elif kind == "text":
                self.note(block, ("type", "text"), at)
                if out and out[-1]["role"] == "user":  # consecutive text blocks: one message
                    out[-1]["content"] += "\n" + str(block.get("text", ""))
                else:
                    out.append({"role": "user", "content": str(block.get("text", ""))})
            else:
                raise GatewayError(
                    400, f"{at}: a {kind!r} block; user messages take text and tool_result blocks"
                )
        return out

    def assistant(self, content: Any, where: str) -> dict[str, Any]:
        if isinstance(content, str):
            return {"role": "assistant", "content": content}
        if not isinstance(content, list):
            raise GatewayError(400, f"{where}.content: expected a string or a list of blocks")
        texts, calls = [], []
        for j, block in enumerate(content):
            at = f"{where}.content[{j}]"
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text":
                self.note(block, ("type", "text"), at)
                texts.append(str(block.get("text", "")))
            elif kind == "tool_use":
                self.note(block, ("type", "id", "name", "input"), at)
                if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                    raise GatewayError(400, f"{at}: a tool_use block needs its id and name")
                args = block.get("input", {})
                if not isinstance(args, dict):
                    args = parse_arguments(args, at)
                calls.append({"id": block["id"], "name": block["name"], "arguments": args})
            else:
                raise GatewayError(
                    400,
                    f"{at}: a {kind!r} block; assistant messages take text and tool_use blocks "
                    "(thinking and server-tool blocks cannot be reproduced)",
                )
        msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
        if calls:
            msg["tool_calls"] = calls
        return msg


def read_request(body: dict[str, Any]) -> tuple[dict[str, Any], set[str]]:
    """A Messages request as a chat-completions body (normalized messages, function tools,
    tool choice, token limit) and the request fields it ignores."""
    r = _Reader()
    r.ignored |= {k for k in body if k not in READ and body[k] not in (None, [], {})}
    messages: list[dict[str, Any]] = []
    if body.get("system"):
        messages.append({"role": "system", "content": r.text_blocks(body["system"], "system")})
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise GatewayError(400, "messages must be a non-empty list")
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise GatewayError(400, f"{where}: expected a user or assistant message")
        r.note(m, ("role", "content"), where)
        if m["role"] == "user":
            messages.extend(r.user(m.get("content"), where))
        else:
            messages.append(r.assistant(m.get("content"), where))
    chat: dict[str, Any] = {"messages": messages}
    tools = tools_of(body.get("tools"), r)
    if tools:
        chat["tools"] = tools
    choice = body.get("tool_choice")
    if choice is not None:
        if not isinstance(choice, dict) or choice.get("type") not in (*TOOL_CHOICES, "tool"):
            raise GatewayError(
                400, f"tool_choice: expected auto, any, tool or none, not {choice!r}"
            )
        if choice.get("disable_parallel_tool_use"):
            r.ignored.add("tool_choice.disable_parallel_tool_use")
        chat["tool_choice"] = (
            {"type": "function", "function": {"name": choice.get("name")}}
            if choice["type"] == "tool"
            else TOOL_CHOICES[choice["type"]]
        )
    if body.get("max_tokens") is not None:
        chat["max_tokens"] = body["max_tokens"]
    return chat, r.ignored


def tools_of(raw: Any, r: _Reader) -> list[dict[str, Any]] | None:
    """Client tools as chat's function tools; a server tool (one with a ``type`` such as
    ``web_search_20250305`` or ``bash_20250124``) is refused: its calls run on Anthropic's
    side, which nothing here stands in for."""
    raw = tool_list(raw)
    if raw is None:
        return None
    out = []
    for i, t in enumerate(raw):
        where = f"tools[{i}]"
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise GatewayError(400, f"{where}: expected {{'name', 'description', 'input_schema'}}")
        if t.get("type") not in (None, "custom"):
            raise GatewayError(
                400, f"{where}: {t['type']!r} is a server tool; only client tools are supported"
            )
        if not isinstance(t.get("input_schema"), dict):
            raise GatewayError(400, f"{where}: a tool needs its input_schema")
        r.note(t, ("type", "name", "description", "input_schema"), "tools")
        fn: dict[str, Any] = {"name": t["name"]}
        if t.get("description") is not None:
            fn["description"] = t["description"]
        fn["parameters"] = t["input_schema"]
        out.append({"type": "function", "function": fn})
    return out


def answer_body(chat: dict[str, Any], model: str | None) -> dict[str, Any]:
    """The core's chat completion as an Anthropic ``message``."""
    choice = chat["choices"][0]
    msg = choice["message"]
    content: list[dict[str, Any]] = []
    if msg.get("content"):
        content.append({"type": "text", "text": msg["content"]})
    for c in msg.get("tool_calls") or ():
        fn = c["function"]
        content.append(
            {
                "type": "tool_use",
                "id": c["id"],
                "name": fn["name"],
                "input": parse_arguments(fn["arguments"], "the answer"),
            }
        )
    usage = chat["usage"]
    return {
        "id": chat["id"].replace("chatcmpl-", "msg_", 1),
        "type": "message",
        "role": "assistant",
        "model": model or chat["model"],
        "content": content,
        "stop_reason": STOP[choice["finish_reason"]],
        "stop_sequence": None,
        "usage": {
            "input_tokens": usage["prompt_tokens"],
            "output_tokens": usage["completion_tokens"],
        },
        "policy_version": chat.get("policy_version"),
        "tracerl": chat.get("tracerl"),
    }


def stream_events(message: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The same answer as Anthropic's stream: ``message_start``, per block
    ``content_block_start`` / ``_delta`` / ``_stop``, ``message_delta``, ``message_stop``."""
    head = {
        **message,
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": message["usage"]["input_tokens"], "output_tokens": 0},
    }
    out: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": head})
    ]
    for i, block in enumerate(message["content"]):
        if block["type"] == "text":
            start, delta = (
                {"type": "text", "text": ""},
                {"type": "text_delta", "text": block["text"]},
            )
        else:
            start = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": _json(block["input"])}
        out.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": i, "content_block": start},
            )
        )
        out.append(
            ("content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta})
        )
        out.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    usage = {"output_tokens": message["usage"]["output_tokens"]}
    out.append(("message_delta", {"type": "message_delta", "delta": delta, "usage": usage}))
    out.append(("message_stop", {"type": "message_stop"}))
    return out


def _json(value: Any) -> str:
    import json

    return json.dumps(value, ensure_ascii=False)
