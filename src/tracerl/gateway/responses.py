"""OpenAI's Responses API (``POST /v1/responses``), as the gateway reads and answers it.

A request is translated into the chat-completions form the session core records
(`tracerl.gateway.chat`), and the core's answer back into a ``response``:

* ``instructions`` is the system message (as in OpenAI's API, a chained request does not
  inherit the previous response's instructions: it sends its own);
* ``input`` (a string, or items) gives the new messages: ``message`` items (roles user,
  system, developer, assistant; ``input_text`` / ``output_text`` parts) are messages;
  ``function_call`` items are the assistant's tool calls (joined to the assistant message
  before them, as the gateway answered them); ``function_call_output`` items are tool
  messages;
* ``previous_response_id`` prepends that response's conversation (its input and its
  output), kept server-side per session. A chain that does not continue the session's
  history (a response id older than the latest, a changed instruction) is a recorded
  break, as any rewrite is; an id this session never answered is refused;
* function ``tools`` are chat's function tools; ``tool_choice`` maps as for chat (only
  ``none`` changes anything); ``max_output_tokens`` can only lower
  ``rollout.max_turn_tokens``.

Fail-closed: an item or content part the gateway cannot render exactly (reasoning items,
images, files, hosted tools' calls, item references), a hosted tool (web search, file
search, computer use ...), server-side ``conversation`` state and ``background`` mode are
refused (400, naming where); every request field that changes nothing (sampling
parameters, ``reasoning``, ``text`` formats, ``truncation``, ``metadata`` ...) is recorded
in the receipt (``ignored_params``).

The answer's ``output`` is a ``message`` item (what the model wrote besides its calls) and
a ``function_call`` item per call; a turn cut by the token limit is ``incomplete``
(``max_output_tokens``). ``stream: true`` gets the same answer as the Responses event
stream.
"""

from __future__ import annotations

import json
import time
from typing import Any

from tracerl.gateway.chat import FieldReader, GatewayError, parse_arguments, tool_list

PROTOCOL = "openai-responses"
ROUTES = ("/v1/responses", "/responses")

READ = (
    "model", "input", "instructions", "tools", "tool_choice", "previous_response_id",
    "store", "stream", "max_output_tokens", "user",
)  # fmt: skip
REFUSED = {
    "conversation": "server-side conversation state cannot be reproduced; send the input",
    "background": "background responses are not supported; wait for the answer",
    "prompt": "stored prompt templates are not supported; send instructions and input",
}
ROLES = ("user", "system", "developer", "assistant")
TEXT_PARTS = ("input_text", "output_text", "text")
# part and item fields that may be present and empty (the SDK echoes its own items back)
EMPTY_OK = ("annotations", "logprobs")
ITEM_FIELDS = ("type", "role", "content", "id", "status")


def error_body(e: GatewayError) -> dict[str, Any]:
    return e.body()  # the same error shape as chat completions


class _Reader(FieldReader):
    empty_ok = EMPTY_OK

    def text(self, value: Any, where: str) -> str:
        return self.texts(value, where, TEXT_PARTS, "part")

    def items(self, raw: Any) -> list[dict[str, Any]]:
        if isinstance(raw, str):
            return [{"role": "user", "content": raw}]
        if not isinstance(raw, list):
            raise GatewayError(400, "input must be a string or a list of items")
        out: list[dict[str, Any]] = []
        for i, item in enumerate(raw):
            where = f"input[{i}]"
            if not isinstance(item, dict):
                raise GatewayError(400, f"{where}: expected an item object")
            kind = item.get("type", "message")
            if kind == "message":
                role = item.get("role")
                if role not in ROLES:
                    raise GatewayError(400, f"{where}: unknown role {role!r}")
                self.note(item, ITEM_FIELDS, where, "message")
                role = "system" if role == "developer" else role
                out.append({"role": role, "content": self.text(item.get("content"), where)})
            elif kind == "function_call":
                self.note(
                    item, ("type", "call_id", "name", "arguments", "id", "status"), where, kind
                )
                if not isinstance(item.get("call_id"), str) or not isinstance(
                    item.get("name"), str
                ):
                    raise GatewayError(400, f"{where}: a function_call needs its call_id and name")
                call = {
                    "id": item["call_id"],
                    "name": item["name"],
                    "arguments": parse_arguments(item.get("arguments", ""), where),
                }
                if out and out[-1]["role"] == "assistant":  # the calls of the message before
                    out[-1].setdefault("tool_calls", []).append(call)
                else:
                    out.append({"role": "assistant", "content": "", "tool_calls": [call]})
            elif kind == "function_call_output":
                self.note(item, ("type", "call_id", "output", "id", "status"), where, kind)
                if not isinstance(item.get("call_id"), str):
                    raise GatewayError(400, f"{where}: a function_call_output needs its call_id")
                content = self.text(item.get("output", ""), f"{where}.output")
                out.append({"role": "tool", "tool_call_id": item["call_id"], "content": content})
            else:
                raise GatewayError(
                    400,
                    f"{where}: a {kind!r} item; the gateway takes message, function_call and "
                    "function_call_output items (reasoning items, hosted tools' calls and "
                    "item references cannot be reproduced)",
                )
        return out


def read_request(
    body: dict[str, Any], stored: dict[str, list[dict[str, Any]]]
) -> tuple[dict[str, Any], list[dict[str, Any]], set[str]]:
    """A Responses request as a chat-completions body, the conversation it stands for
    without its instructions (what a later ``previous_response_id`` continues), and the
    request fields it ignores. `stored`: this session's responses by id."""
    for key, why in REFUSED.items():
        if body.get(key):
            raise GatewayError(400, f"{key}: {why}")
    r = _Reader()
    r.ignored |= {k for k in body if k not in READ and body[k] not in (None, [], {})}
    conversation: list[dict[str, Any]] = []
    previous = body.get("previous_response_id")
    if previous is not None:
        if previous not in stored:
            raise GatewayError(
                400,
                f"previous_response_id {previous!r}: no response of this session has that id "
                "(or it was not stored)",
                "previous_response_not_found",
            )
        conversation = [dict(m) for m in stored[previous]]
    conversation.extend(r.items(body.get("input")))
    messages = list(conversation)
    if body.get("instructions"):
        messages.insert(
            0, {"role": "system", "content": r.text(body["instructions"], "instructions")}
        )
    if not messages:
        raise GatewayError(400, "input must not be empty")
    chat: dict[str, Any] = {"messages": messages}
    tools = tools_of(body.get("tools"), r)
    if tools:
        chat["tools"] = tools
    choice = body.get("tool_choice")
    if choice is not None:
        if choice in ("none", "auto", "required"):
            chat["tool_choice"] = choice
        elif isinstance(choice, dict) and choice.get("type") == "function":
            chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
        else:
            raise GatewayError(400, f"tool_choice: {choice!r} names a hosted tool; not supported")
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    return chat, conversation, r.ignored


def tools_of(raw: Any, r: _Reader) -> list[dict[str, Any]] | None:
    """Function tools in chat's form; a hosted tool is refused (it runs on OpenAI's side,
    which nothing here stands in for)."""
    raw = tool_list(raw)
    if raw is None:
        return None
    out = []
    for i, t in enumerate(raw):
        where = f"tools[{i}]"
        if not isinstance(t, dict):
            raise GatewayError(400, f"{where}: expected a function tool")
        if t.get("type") != "function":
            raise GatewayError(
                400,
                f"{where}: {t.get('type')!r} is a hosted tool; only function tools are supported",
            )
        if not isinstance(t.get("name"), str):
            raise GatewayError(400, f"{where}: a function tool needs its name")
        r.note(t, ("type", "name", "description", "parameters", "strict"), where, "tools")
        fn = {k: t[k] for k in ("name", "description", "parameters", "strict") if k in t}
        out.append({"type": "function", "function": fn})
    return out


def answered(chat: dict[str, Any]) -> dict[str, Any]:
    """The core's answer as the session's history holds it (normalized)."""
    msg = chat["choices"][0]["message"]
    out: dict[str, Any] = {"role": "assistant", "content": msg.get("content") or ""}
    if msg.get("tool_calls"):
        out["tool_calls"] = [
            {
                "id": c["id"],
                "name": c["function"]["name"],
                "arguments": parse_arguments(c["function"]["arguments"], "the answer"),
            }
            for c in msg["tool_calls"]
        ]
    return out


def answer_body(chat: dict[str, Any], body: dict[str, Any], rid: str) -> dict[str, Any]:
    """The core's chat completion as a ``response`` object."""
    choice = chat["choices"][0]
    msg = choice["message"]
    output: list[dict[str, Any]] = []
    if msg.get("content"):
        part = {"type": "output_text", "text": msg["content"], "annotations": [], "logprobs": []}
        output.append(
            {
                "type": "message",
                "id": f"msg_{rid[5:]}",
                "status": "completed",
                "role": "assistant",
                "content": [part],
            }
        )
    for k, c in enumerate(msg.get("tool_calls") or ()):
        output.append(
            {
                "type": "function_call",
                "id": f"fc_{rid[5:]}_{k}",
                "call_id": c["id"],
                "name": c["function"]["name"],
                "arguments": c["function"]["arguments"],
                "status": "completed",
            }
        )
    cut = choice["finish_reason"] == "length"
    usage = chat["usage"]
    return {
        "id": rid,
        "object": "response",
        "created_at": int(time.time()),
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "error": None,
        "model": body.get("model") or chat["model"],
        "instructions": body.get("instructions"),
        "previous_response_id": body.get("previous_response_id"),
        "output": output,
        "parallel_tool_calls": bool(body.get("parallel_tool_calls", True)),
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": body.get("tools") or [],
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "max_output_tokens": body.get("max_output_tokens"),
        "store": body.get("store", True) is not False,
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "metadata": body.get("metadata") or {},
        "usage": {
            "input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["total_tokens"],
        },
        "policy_version": chat.get("policy_version"),
        "tracerl": chat.get("tracerl"),
    }


def stream_events(response: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The same answer as the Responses event stream (``response.created`` ... per output
    item its added / delta / done events ... ``response.completed``)."""
    events: list[tuple[str, dict[str, Any]]] = []

    def emit(kind: str, **fields: Any) -> None:
        events.append((kind, {"type": kind, "sequence_number": len(events), **fields}))

    pending = {**response, "status": "in_progress", "output": [], "usage": None}
    emit("response.created", response=pending)
    emit("response.in_progress", response=pending)
    for i, item in enumerate(response["output"]):
        if item["type"] == "message":
            text = item["content"][0]["text"]
            emit("response.output_item.added", output_index=i,
                 item={**item, "status": "in_progress", "content": []})  # fmt: skip
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            ids = {"item_id": item["id"], "output_index": i, "content_index": 0}
            emit("response.content_part.added", **ids, part=part)
            emit("response.output_text.delta", **ids, delta=text, logprobs=[])
            emit("response.output_text.done", **ids, text=text, logprobs=[])
            emit("response.content_part.done", **ids, part=item["content"][0])
        else:
            emit("response.output_item.added", output_index=i,
                 item={**item, "status": "in_progress", "arguments": ""})  # fmt: skip
            ids = {"item_id": item["id"], "output_index": i}
            emit("response.function_call_arguments.delta", **ids, delta=item["arguments"])
            emit("response.function_call_arguments.done", **ids, arguments=item["arguments"],
                 name=item["name"])  # fmt: skip
        emit("response.output_item.done", output_index=i, item=item)
    final = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
    emit(final, response=response)
    return events


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)
