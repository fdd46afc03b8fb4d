"""A conversation: one episode's token stream, built turn by turn with provenance.

See `tracerl.models.render` for how each kind of token is produced; this module holds the
state machine (prompt -> policy -> observation -> policy ...) and the attribution of every
observation delta to template scaffold, environment content and echoes.
"""

from __future__ import annotations

import copy
import datetime as _dt
import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from tracerl.models.render import (
    OBSERVATION_ROLES,
    ROLES,
    SENTINEL,
    SENTINEL_RE,
    ChatRenderer,
    match_content,
)
from tracerl.types import Segment, Source, ToolCall, Trajectory, TrajectoryError

log = logging.getLogger("tracerl")


@dataclass(frozen=True)
class _Piece:
    text: str
    source: Source
    step: int
    tool_call_id: str | None = None
    content: bool = False  # tokenized with special tokens split
    ids: tuple[int, ...] | None = None  # already tokens (the unsampled end of a model turn)


class Conversation:
    """One episode's token stream, built turn by turn with provenance.

    Use `token_ids` as the sampler's input, `add_policy` for each model turn and
    `add_observation` for what the environment answers. `trajectory()` is the current sample;
    `samples()` lists every sample of the episode (more than one only after a prefix break).
    """

    def __init__(
        self,
        renderer: ChatRenderer,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None,
        *,
        episode_id: str | None = None,
    ) -> None:
        self.renderer = renderer
        self.tools = list(tools) if tools else None
        self.episode_id = episode_id
        self.template_kwargs: dict[str, Any] = {}
        if renderer.prints_date and "date_string" not in renderer.template_kwargs:
            self.template_kwargs["date_string"] = _dt.date.today().strftime("%d %b %Y")
        self.messages: list[dict[str, Any]] = []
        self.open_calls: dict[str, ToolCall] = {}
        self._answered: set[str] = set()
        self.step = 0
        self.prefix_breaks = 0
        self._closed: list[Trajectory] = []
        self._segments: list[Segment] = []
        self._steps: list[dict[str, Any]] = []
        self._awaiting_policy = True
        self._pending_close: list[int] = []
        for i, m in enumerate(messages):
            self._accept(m, where=f"initial message {i}", initial=True)
        if not self.messages:
            raise TrajectoryError("conversation: needs at least one initial message")
        self._start_sample()

    # ---- views ---------------------------------------------------------------------------
    @property
    def token_ids(self) -> list[int]:
        """The current sample's tokens: what the sampler continues from."""
        return [t for s in self._segments for t in s.token_ids]

    def trajectory(self) -> Trajectory:
        return Trajectory(
            segments=tuple(self._segments),
            steps=copy.deepcopy(tuple(self._steps)),  # a snapshot: later turns never change it
            episode_id=self.episode_id,
            sample_index=len(self._closed),
        )

    def samples(self) -> list[Trajectory]:
        return [*self._closed, self.trajectory()]

    # ---- turns ---------------------------------------------------------------------------
    def add_policy(
        self,
        token_ids: Sequence[int],
        logprobs: Sequence[float],
        *,
        finish_reason: str = "stop",
        tool_calls: Iterable[ToolCall | dict[str, Any]] = (),
        policy_version: int | None = None,
    ) -> Segment:
        """Append a model turn exactly as sampled. Tool-call arguments inside it carry loss."""
        where = f"step {self.step}: policy turn"
        if not self._awaiting_policy:
            raise TrajectoryError(
                f"{where}: the previous model turn has no observation yet; call "
                "add_observation (or end the episode) before sampling again"
            )
        if finish_reason not in ("stop", "length"):
            raise TrajectoryError(f"{where}: finish_reason must be 'stop' or 'length'")
        ids = [int(t) for t in token_ids]
        stopped = finish_reason == "stop" and bool(ids) and ids[-1] in self.renderer.stop_token_ids
        text = self.renderer.decode(ids)
        content = self.renderer.decode(ids[:-1]) if stopped else text
        try:
            seg = Segment(
                Source.POLICY,
                tuple(ids),
                tuple(logprobs),
                step=self.step,
                text=text,
                policy_version=policy_version,
                finish_reason=finish_reason,
            )
        except TrajectoryError as e:
            raise TrajectoryError(f"{where}: {e}") from None
        calls = [c if isinstance(c, ToolCall) else ToolCall.from_dict(c) for c in tool_calls]
        seen = set()
        for c in calls:
            if c.id in seen or c.id in self.open_calls or c.id in self._answered:
                raise TrajectoryError(f"{where}: tool call id {c.id!r} is used twice")
            seen.add(c.id)
        self._pending_close = self._closing_ids(stopped)
        self.messages.append({"role": "assistant", "content": content, "tool_calls": calls})
        self.open_calls.update({c.id: c for c in calls})
        self._segments.append(seg)
        self._steps.append(
            {
                "step": self.step,
                "tokens": len(ids),
                "finish_reason": finish_reason,
                "tool_calls": [c.to_dict() for c in calls],
                "observations": [],
            }
        )
        self._awaiting_policy = False
        return seg

    def add_observation(self, messages: Sequence[dict[str, Any]]) -> list[Segment]:
        """Append what the environment answered; returns the new segments.

        After a prefix break the returned list is the new sample's prompt segments.
        """
        where = f"step {self.step}: observation"
        if self._awaiting_policy:
            raise TrajectoryError(f"{where}: add_policy must come before add_observation")
        if not messages:
            raise TrajectoryError(f"{where}: no messages given")
        n_before = len(self.messages)
        saved_calls, saved_answered = dict(self.open_calls), set(self._answered)
        before = self._render(add_generation_prompt=False)
        try:
            for i, m in enumerate(messages):
                self._accept(m, where=f"{where} message {i}", initial=False)
            after = self._render(add_generation_prompt=True)
            if not after.startswith(before):
                return self._prefix_break(before, after, where)
            close = _Piece("", Source.TEMPLATE, self.step, ids=tuple(self._pending_close))
            pieces = [close, *self._attribute(n_before, len(before), after, prompt=False)]
        except TrajectoryError:
            # Leave the conversation exactly as it was: nothing half-applied.
            del self.messages[n_before:]
            self.open_calls, self._answered = saved_calls, saved_answered
            raise
        new = self._emit(pieces)
        self.step += 1
        self._awaiting_policy = True
        return new

    # ---- internals -------------------------------------------------------------------------
    def _render(self, *, add_generation_prompt: bool) -> str:
        return self.renderer.render_text(
            self.messages,
            self.tools,
            add_generation_prompt=add_generation_prompt,
            template_kwargs=self.template_kwargs,
        )

    def _accept(self, m: dict[str, Any], *, where: str, initial: bool) -> None:
        if not isinstance(m, dict):
            raise TrajectoryError(f"{where}: expected a dict with 'role' and 'content'")
        role = m.get("role")
        allowed = ROLES if initial else OBSERVATION_ROLES
        if role not in allowed:
            hint = "" if role not in ROLES else " (model turns come from the sampler: add_policy)"
            raise TrajectoryError(
                f"{where}: unknown role {role!r}; expected one of {', '.join(allowed)}{hint}"
            )
        content = m.get("content")
        if not isinstance(content, str):
            raise TrajectoryError(
                f"{where}: content must be a string, got {type(content).__name__}"
            )
        msg: dict[str, Any] = {"role": role, "content": content}
        if role == "tool":
            call_id = m.get("tool_call_id")
            if call_id not in self.open_calls:
                open_ids = ", ".join(sorted(self.open_calls)) or "none"
                already = " (it was already answered)" if call_id in self._answered else ""
                raise TrajectoryError(
                    f"{where}: tool message answers call id {call_id!r}{already}, but no open "
                    f"call has that id (open calls: {open_ids}); answer a call the model made"
                )
            self._answered.add(call_id)
            msg["tool_call_id"] = call_id
            msg["_call"] = self.open_calls.pop(call_id)
            if "echo" in m and m["echo"] is not None:
                if not content.startswith(m["echo"]):
                    raise TrajectoryError(f"{where}: 'echo' must be a prefix of the content")
                msg["_echo"] = m["echo"]
        elif role == "assistant":
            calls = [
                c if isinstance(c, ToolCall) else ToolCall.from_dict(c)
                for c in m.get("tool_calls") or ()
            ]
            self.open_calls.update({c.id: c for c in calls})
            msg["tool_calls"] = calls
        if m.get("name") is not None:
            msg["name"] = m["name"]
        self.messages.append(msg)

    def _start_sample(self) -> None:
        """Render all messages as a fresh prompt (the episode start, or after a break)."""
        full = self._render(add_generation_prompt=True)
        pieces = self._attribute(0, 0, full, prompt=True)
        self._segments = []
        self._steps = []
        self._emit(pieces)
        self._awaiting_policy = True

    def _prefix_break(self, before: str, after: str, where: str) -> list[Segment]:
        at = next(
            (i for i, (a, b) in enumerate(zip(before, after, strict=False)) if a != b),
            min(len(before), len(after)),
        )
        detail = (
            f"{where}: the chat template is not prefix-preserving — appending these messages "
            f"re-renders earlier text from character {at} ({before[at : at + 40]!r} became "
            f"{after[at : at + 40]!r})"
        )
        if self.renderer.on_prefix_break == "raise":
            raise TrajectoryError(detail + "; use on_prefix_break='new_sample' or a fixed template")
        if not self.renderer.warned_prefix_break:
            self.renderer.warned_prefix_break = True
            log.warning("%s; starting a new sample (reported once per renderer)", detail)
        self._steps[-1]["prefix_break"] = detail
        self._closed.append(self.trajectory())
        self.prefix_breaks += 1
        self.step += 1
        self._start_sample()
        return list(self._segments)

    def _closing_ids(self, stopped: bool) -> list[int]:
        close = self.renderer.closing_text(self.messages, self.tools, **self.template_kwargs)
        ids = self.renderer.encode(close, content=False)
        if stopped and ids and ids[0] in self.renderer.stop_token_ids:
            ids = ids[1:]  # the model sampled the turn end itself
        return ids

    def _attribute(self, start: int, offset: int, real: str, *, prompt: bool) -> list[_Piece]:
        """Split `real[offset:]` into scaffold and content pieces for messages[start:]."""
        swapped = [
            {**m, "content": SENTINEL.format(i)}
            if i >= start and m["role"] != "assistant" and m["content"]
            else m
            for i, m in enumerate(self.messages)
        ]
        sent = self.renderer.render_text(
            swapped, self.tools, add_generation_prompt=True, template_kwargs=self.template_kwargs
        )
        gen_prompt = real[len(self._render(add_generation_prompt=False)) :]
        if sent[:offset] != real[:offset]:
            raise TrajectoryError("renderer: the template renders earlier turns from later content")
        parts = SENTINEL_RE.split(sent[offset:])  # scaffold, idx, scaffold, idx, ..., scaffold
        target = real[offset:]
        pieces: list[_Piece] = []
        cursor = 0
        for k in range(0, len(parts), 2):
            scaffold = parts[k]
            if not target.startswith(scaffold, cursor):
                raise TrajectoryError(
                    "renderer: the chat template changes message content while rendering it; "
                    "cannot attribute its tokens"
                )
            pieces.append(_Piece(scaffold, Source.PROMPT if prompt else Source.TEMPLATE, self.step))
            cursor += len(scaffold)
            if k + 1 == len(parts):
                break
            msg = self.messages[int(parts[k + 1])]
            following = parts[k + 2]
            text = match_content(msg["content"], target, cursor, following)
            if text is None:
                raise TrajectoryError(
                    f"renderer: could not place the content of message {parts[k + 1]} "
                    f"({msg['role']}) in the rendered text; the template transforms it"
                )
            pieces.extend(self._content_pieces(msg, text, prompt))
            cursor += len(text)
        if cursor != len(target) or not target.endswith(gen_prompt):
            raise TrajectoryError("renderer: rendered text and attribution disagree")
        # The generation prompt opens the next turn.
        last = pieces.pop()
        head = last.text[: len(last.text) - len(gen_prompt)]
        pieces.append(_Piece(head, last.source, last.step))
        pieces.append(_Piece(gen_prompt, Source.TEMPLATE, self.step + (0 if prompt else 1)))
        return pieces

    def _content_pieces(self, msg: dict[str, Any], text: str, prompt: bool) -> list[_Piece]:
        if prompt:
            return [_Piece(text, Source.PROMPT, self.step, content=True)]
        call_id = msg.get("tool_call_id")
        echo = _echo_prefix(msg, text)
        out = []
        if echo:
            out.append(_Piece(echo, Source.ECHO, self.step, call_id, content=True))
        out.append(_Piece(text[len(echo) :], Source.ENVIRONMENT, self.step, call_id, content=True))
        return out

    def _emit(self, pieces: list[_Piece]) -> list[Segment]:
        """Tokenize pieces, merge neighbours with the same author, append as segments."""
        runs: list[tuple[_Piece, list[int]]] = []
        for p in pieces:
            ids = (
                list(p.ids)
                if p.ids is not None
                else self.renderer.encode(p.text, content=p.content)
            )
            if not ids:
                continue
            key = (p.source, p.step, p.tool_call_id)
            if runs and (runs[-1][0].source, runs[-1][0].step, runs[-1][0].tool_call_id) == key:
                runs[-1][1].extend(ids)
            else:
                runs.append((p, ids))
        new = [
            Segment(
                p.source,
                tuple(ids),
                step=p.step,
                tool_call_id=p.tool_call_id,
                text=self.renderer.decode(ids),
            )
            for p, ids in runs
        ]
        self._segments.extend(new)
        if self._steps and not self._awaiting_policy:
            self._steps[-1]["observations"].extend(
                {
                    "source": s.source.value,
                    "tokens": len(s.token_ids),
                    "tool_call_id": s.tool_call_id,
                }
                for s in new
                if s.source in (Source.ENVIRONMENT, Source.ECHO)
            )
        return new


def _echo_prefix(msg: dict[str, Any], text: str) -> str:
    """The leading part of a tool message that repeats the model's own call, if any.

    Declared by the tool framework (`echo=`), or recognised as the exact text the model sampled
    for the call it answers.
    """
    declared = msg.get("_echo")
    if declared and text.startswith(declared):
        return declared
    call: ToolCall | None = msg.get("_call")
    if call is not None:
        canonical = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
        for form in (call.raw, canonical):
            if form and text.startswith(form):
                return form
    return ""
