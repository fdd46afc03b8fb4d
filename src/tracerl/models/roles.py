"""What a conversation and its renderer agree on: the roles a message may have, which of them
an observation may use, what a broken prefix does, and what a `Conversation` needs of its
renderer (`tracerl.models.render.ChatRenderer` is the one tracerl ships)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol

PrefixBreakPolicy = Literal["new_sample", "raise"]


class Renderer(Protocol):
    """What a conversation needs of its renderer (`tracerl.models.render.ChatRenderer`)."""

    template_kwargs: dict[str, Any]
    prints_date: bool
    on_prefix_break: PrefixBreakPolicy
    warned_prefix_break: bool
    stop_token_ids: frozenset[int]

    def render_text(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None,
        *,
        add_generation_prompt: bool,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str: ...

    def encode_pieces(self, pieces: Sequence[tuple[str, bool]]) -> list[list[int]]: ...

    def spells_special(self, text: str) -> bool: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...


ROLES = ("system", "user", "assistant", "tool")
OBSERVATION_ROLES = ("tool", "user", "system")
