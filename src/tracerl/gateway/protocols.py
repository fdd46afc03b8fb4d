"""The wire protocols the gateway speaks, over one session core.

Every protocol's request is translated into the chat-completions form the session records
(`GatewaySession.complete`): the same rendering, provenance, break detection, budgets and
receipts whatever the harness speaks, and exact replay from the recorded (normalized)
requests. Only the envelope differs:

| protocol | routes | module |
|---|---|---|
| ``openai-chat`` | ``/v1/chat/completions`` | `tracerl.gateway.chat` |
| ``openai-responses`` | ``/v1/responses`` | `tracerl.gateway.responses` |
| ``anthropic-messages`` | ``/v1/messages`` | `tracerl.gateway.messages` |
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tracerl.gateway import messages, responses
from tracerl.gateway.chat import GatewayError, stream_chunks
from tracerl.gateway.session import GatewaySession

CHAT = "openai-chat"


@dataclass(frozen=True)
class Protocol:
    name: str
    routes: tuple[str, ...]
    error_body: Callable[[GatewayError], dict[str, Any]]

    async def answer(self, session: GatewaySession, body: dict[str, Any]) -> dict[str, Any]:
        """`body` answered by `session` in this protocol's form (or a `GatewayError`)."""
        if self.name == CHAT:
            return await session.complete(body)
        if self.name == messages.PROTOCOL:
            chat, ignored = messages.read_request(body)
            out = await session.complete(chat, protocol=self.name, ignored=ignored)
            return messages.answer_body(out, body.get("model"))
        chat, conversation, ignored = responses.read_request(body, session.stored_responses)
        out = await session.complete(chat, protocol=self.name, ignored=ignored)
        rid = "resp_" + secrets.token_hex(12)
        if body.get("store", True) is not False:  # what previous_response_id may continue
            session.stored_responses[rid] = [*conversation, responses.answered(out)]
        return responses.answer_body(out, body, rid)

    def stream(self, answer: dict[str, Any]) -> bytes:
        """The answer as this protocol's server-sent events (the turn is sampled whole,
        then sent as events)."""
        if self.name == CHAT:
            events = "".join(f"data: {json.dumps(c)}\n\n" for c in stream_chunks(answer))
            return (events + "data: [DONE]\n\n").encode()
        fn = messages.stream_events if self.name == messages.PROTOCOL else responses.stream_events
        return "".join(
            f"event: {kind}\ndata: {json.dumps(data)}\n\n" for kind, data in fn(answer)
        ).encode()


PROTOCOLS = (
    Protocol(CHAT, ("/v1/chat/completions", "/chat/completions"), GatewayError.body),
    Protocol(responses.PROTOCOL, responses.ROUTES, responses.error_body),
    # the Anthropic SDK adds /v1 itself: a client given the OpenAI-style base URL (…/v1)
    # posts to /v1/v1/messages
    Protocol(messages.PROTOCOL, (*messages.ROUTES, "/v1/v1/messages"), messages.error_body),
)
BY_ROUTE = {route: p for p in PROTOCOLS for route in p.routes}
