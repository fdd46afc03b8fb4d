"""A conversation: one episode's token stream, built turn by turn with provenance.

See `tracerl.models.render` for how each kind of token is produced. This module holds the
state machine (prompt -> policy -> observation -> policy ...); `tracerl.models.attribution`
splits each rendered delta into template scaffold, environment content and echoes.

The anchor of every check is the token stream itself: the current sample's tokens spell out
the template's rendering of the conversation so far (`_rendered`) followed by the model's
turn. An observation is appended only if rendering the conversation with it *starts with*
that stream; otherwise the template is not prefix-preserving here, and the sample is closed.
"""

from __future__ import annotations

import copy
import datetime as _dt
import logging
import operator
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from tracerl.models.attribution import Piece, Sentinels, split_delta, split_generation_prompt
from tracerl.models.roles import OBSERVATION_ROLES, ROLES, Renderer
from tracerl.types import Segment, Source, ToolCall, Trajectory, TrajectoryError

log = logging.getLogger("tracerl")


class Conversation:
    """One episode's token stream, built turn by turn with provenance.

    Use `token_ids` as the sampler's input, `add_policy` for each model turn and
    `add_observation` for what the environment answers. `trajectory()` is the current sample;
    `samples()` lists every sample of the episode (more than one only after a prefix break).
    A call that raises leaves the conversation exactly as it was.
    """

    def __init__(
        self,
        renderer: Renderer,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None,
        *,
        episode_id: str | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.renderer = renderer
        self.tools = list(tools) if tools else None
        self.episode_id = episode_id
        # Templates that print today's date see the date this conversation started, so a long
        # episode cannot straddle midnight and break its own prefix.
        self.started_at = _dt.datetime.now()
        # A replay passes the recorded values, so it renders exactly what the episode saw.
        self.template_kwargs: dict[str, Any] = dict(template_kwargs or {})
        if (
            template_kwargs is None
            and renderer.prints_date
            and "date_string" not in renderer.template_kwargs
        ):
            self.template_kwargs["date_string"] = self.started_at.strftime("%d %b %Y")
        # Templates that call strftime_now() without a date_string override (gpt-oss) cannot be
        # frozen this way; crossing midnight there is caught as a prefix break.
        self.messages: list[dict[str, Any]] = []
        self.open_calls: dict[str, ToolCall] = {}
        self.step = 0
        self.prefix_breaks = 0
        self._sentinels = Sentinels()
        self._answered: set[str] = set()
        self._closed: list[Trajectory] = []
        self._segments: list[Segment] = []
        self._steps: list[dict[str, Any]] = []
        self._rendered = ""  # the template's text that the sample's non-policy tokens spell
        self._turn: tuple[str, str] | None = None  # (content, sampled stop text) awaiting reply
        for i, m in enumerate(messages):
            self.messages.append(self._accept(m, f"initial message {i}", initial=True))
        if not self.messages:
            raise TrajectoryError("conversation: needs at least one initial message")
        self._start_sample(*self._prompt(self.messages))

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
        if self._turn is not None:
            raise TrajectoryError(
                f"{where}: the previous model turn has no observation yet; call "
                "add_observation (or end the episode) before sampling again"
            )
        if finish_reason not in ("stop", "length"):
            raise TrajectoryError(f"{where}: finish_reason must be 'stop' or 'length'")
        ids = []
        for i, t in enumerate(token_ids):
            if isinstance(t, bool | float) or not hasattr(t, "__index__"):
                raise TrajectoryError(f"{where}: token {i} is {t!r}; token ids are integers")
            ids.append(operator.index(t))
        try:
            seg = Segment(
                Source.POLICY,
                tuple(ids),
                tuple(logprobs),
                step=self.step,
                text=self.renderer.decode(ids),
                policy_version=policy_version,
                finish_reason=finish_reason,
            )
        except TrajectoryError as e:
            raise TrajectoryError(f"{where}: {e}") from None
        calls = [c if isinstance(c, ToolCall) else ToolCall.from_dict(c) for c in tool_calls]
        ids_seen = [c.id for c in calls]
        for c in calls:
            if ids_seen.count(c.id) > 1 or c.id in self.open_calls or c.id in self._answered:
                raise TrajectoryError(f"{where}: tool call id {c.id!r} is used twice")
        stopped = finish_reason == "stop" and ids[-1] in self.renderer.stop_token_ids
        body = self.renderer.decode(ids[:-1]) if stopped else seg.text or ""
        stop_text = self.renderer.decode(ids[-1:]) if stopped else ""
        self.messages.append({"role": "assistant", "content": body, "tool_calls": calls})
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
        self._turn = (body, stop_text)
        return seg

    def add_observation(self, messages: Sequence[dict[str, Any]]) -> list[Segment]:
        """Append what the environment answered; returns the new segments.

        After a prefix break the returned list is the new sample's prompt segments.
        """
        where = f"step {self.step}: observation"
        if self._turn is None:
            raise TrajectoryError(f"{where}: add_policy must come before add_observation")
        if not messages:
            raise TrajectoryError(f"{where}: no messages given")
        with self._transaction():
            first_new = len(self.messages)
            for i, m in enumerate(messages):
                self.messages.append(self._accept(m, f"{where} message {i}", initial=False))
            after = self._render(self.messages, add_generation_prompt=True)
            body, stop_text = self._turn
            anchor = self._rendered + body
            if not after.startswith(anchor):
                return self._prefix_break(anchor, after, where)
            offset = len(anchor)
            sampled_end = bool(stop_text) and after.startswith(stop_text, offset)
            offset += len(stop_text) if sampled_end else 0
            pieces = self._attribute(first_new, offset, after, prompt=False)
            # The model's turn end: sampled by the model, or closed by the template (a turn cut
            # by the token limit, or a stop token other than the template's own turn end).
            self._steps[-1]["turn_end"] = "sampled" if sampled_end else "template"
            self._rendered = after
            self._turn = None
            new = self._emit(pieces, record=True)
            self.step += 1
            return new

    def restart(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None,
        *,
        reason: str,
    ) -> list[Segment]:
        """Close the current sample and start a new one whose prompt is `messages`: the
        history was rewritten by whoever holds it (an agent harness that dropped, edited or
        reordered earlier messages: `tracerl.gateway`). Nothing is spliced: earlier model
        turns in `messages` are prompt tokens of the new sample, never policy tokens.

        `reason` is recorded as the closed sample's ``history_break``. A current sample
        with no model turn yet is replaced, not kept (it holds nothing that was sampled).
        Returns the new sample's prompt segments."""
        with self._transaction():
            self._close_sample("history_break", reason)
            self.tools = list(tools) if tools else None
            self.messages, self.open_calls, self._answered = [], {}, set()
            for i, m in enumerate(messages):
                self.messages.append(self._accept(m, f"restart message {i}", initial=True))
            if not self.messages:
                raise TrajectoryError("conversation: a restart needs at least one message")
            self._start_sample(*self._prompt(self.messages))
            return list(self._segments)

    # ---- trials (nothing changes) ------------------------------------------------------------
    def length_with(self, messages: Sequence[dict[str, Any]]) -> int:
        """How many tokens the next model turn would continue from after `messages` as the
        next observation: the current sample's, or (where the template re-renders earlier
        turns: a prefix break) the new sample's. Nothing changes (a context policy's look
        ahead: `tracerl.rollout.context`)."""
        return self._trial(lambda: self.add_observation(messages))

    def length_of_restart(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None
    ) -> int:
        """How many tokens a new sample whose prompt is `messages` would start with (see
        `restart`); nothing changes."""
        return self._trial(lambda: self.restart(messages, tools, reason="trial"))

    def _trial(self, change: Any) -> int:
        saved_warned = getattr(self.renderer, "warned_prefix_break", None)
        if saved_warned is not None:  # a trial warns of nothing
            self.renderer.warned_prefix_break = True
        result = [0]

        class _Undo(Exception):
            pass

        try:
            with self._transaction():
                change()
                result[0] = len(self.token_ids)
                raise _Undo
        except _Undo:
            pass
        finally:
            if saved_warned is not None:
                self.renderer.warned_prefix_break = saved_warned
        return result[0]

    # ---- internals -------------------------------------------------------------------------
    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """Restore every piece of state if the body raises: nothing is ever half-applied."""
        # Containers are copied (step records deeply: observations are appended into them);
        # everything else is immutable or replaced, never mutated in place.
        saved = dict(self.__dict__)
        for k, v in saved.items():
            if isinstance(v, list | dict | set):
                saved[k] = copy.deepcopy(v) if k == "_steps" else copy.copy(v)
        try:
            yield
        except BaseException:
            self.__dict__.clear()
            self.__dict__.update(saved)
            raise

    def _render(self, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool) -> str:
        return self.renderer.render_text(
            messages,
            self.tools,
            add_generation_prompt=add_generation_prompt,
            template_kwargs=self.template_kwargs,
        )

    def _accept(self, m: Any, where: str, *, initial: bool) -> dict[str, Any]:
        """Validate one message; consumes the tool call it answers."""
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
        if m.get("name") is not None:
            msg["name"] = m["name"]
        if role == "tool":
            call_id = m.get("tool_call_id")
            if call_id not in self.open_calls:
                open_ids = ", ".join(sorted(self.open_calls)) or "none"
                already = " (it was already answered)" if call_id in self._answered else ""
                raise TrajectoryError(
                    f"{where}: tool message answers call id {call_id!r}{already}, but no open "
                    f"call has that id (open calls: {open_ids}); answer a call the model made"
                )
            echo = m.get("echo")
            if echo is not None and not (isinstance(echo, str) and content.startswith(echo)):
                raise TrajectoryError(f"{where}: 'echo' must be a prefix of the content (a str)")
            self._answered.add(call_id)
            msg.update(tool_call_id=call_id, _call=self.open_calls.pop(call_id), _echo=echo)
        elif role == "assistant":
            calls = [
                c if isinstance(c, ToolCall) else ToolCall.from_dict(c)
                for c in m.get("tool_calls") or ()
            ]
            self.open_calls.update({c.id: c for c in calls})
            msg["tool_calls"] = calls
        return msg

    def _prompt(self, messages: list[dict[str, Any]]) -> tuple[str, list[Piece]]:
        full = self._render(messages, add_generation_prompt=True)
        return full, self._attribute(0, 0, full, prompt=True)

    def _close_sample(self, key: str, reason: str) -> None:
        """End the current sample: recorded (`reason` under `key` in its last step) if it
        holds a model turn, dropped if not; the break takes the place of the observation
        the last model turn was waiting for."""
        if any(s.source is Source.POLICY for s in self._segments):
            self._steps[-1][key] = reason
            self._closed.append(self.trajectory())
        if self._turn is not None:
            self.step += 1

    def _start_sample(self, rendered: str, pieces: list[Piece]) -> None:
        self._segments = []
        self._steps = []
        self._rendered = rendered
        self._turn = None
        self._emit(pieces, record=False)

    def _prefix_break(self, anchor: str, after: str, where: str) -> list[Segment]:
        at = next(
            (i for i, (a, b) in enumerate(zip(anchor, after, strict=False)) if a != b),
            min(len(anchor), len(after)),
        )
        detail = (
            f"{where}: the chat template is not prefix-preserving — with these messages it "
            f"renders the conversation differently from the tokens so far at character {at} "
            f"({anchor[at : at + 40]!r} became {after[at : at + 40]!r})"
        )
        if self.renderer.on_prefix_break == "raise":
            raise TrajectoryError(detail + "; use on_prefix_break='new_sample' or a fixed template")
        self._close_sample("prefix_break", detail)
        self.prefix_breaks += 1
        self._start_sample(*self._prompt(self.messages))  # a failure here rolls all of it back
        if not self.renderer.warned_prefix_break:
            self.renderer.warned_prefix_break = True
            log.warning("%s; starting a new sample (reported once per renderer)", detail)
        return list(self._segments)

    def _attribute(self, first_new: int, offset: int, real: str, *, prompt: bool) -> list[Piece]:
        """Split `real[offset:]` into scaffold and content pieces for messages[first_new:]."""
        msgs = self.messages
        # Earlier model turns in a prompt are rendered as the template prints them (scaffold:
        # the model's own added tokens such as <tool_call> stay single tokens), unless their
        # text spells a special token (<|im_end|> written out): then they are content, so
        # no text a model (or a harness) wrote can forge a turn boundary in a new prompt.
        swap = {
            i
            for i in range(first_new, len(msgs))
            if msgs[i]["content"]
            and (
                msgs[i]["role"] != "assistant"
                or (prompt and self.renderer.spells_special(msgs[i]["content"]))
            )
        }
        swapped = [
            {**m, "content": self._sentinels(i)} if i in swap else m for i, m in enumerate(msgs)
        ]
        sent = self._render(swapped, add_generation_prompt=True)
        if sent[:offset] != real[:offset]:
            raise TrajectoryError(
                "renderer: the chat template renders earlier turns differently depending on "
                "the content of later messages; cannot attribute the new tokens"
            )
        parts = self._sentinels.split(sent[offset:])  # scaffold, i, scaffold, ..., scaffold
        missing = sorted(swap - {int(p) for p in parts[1::2]})
        if missing:
            m = msgs[missing[0]]
            raise TrajectoryError(
                f"renderer: message {missing[0]} ({m['role']}) does not appear in the rendered "
                f"text — the chat template drops it (does it render the {m['role']!r} role?); "
                "nothing was appended"
            )
        pieces = split_delta(msgs, parts, real[offset:], self.step, prompt=prompt)
        no_gen = self._render(msgs, add_generation_prompt=False)
        gen = real[len(no_gen) :] if real.startswith(no_gen) and len(no_gen) >= offset else None
        return split_generation_prompt(pieces, gen, self.step + (0 if prompt else 1))

    def _emit(self, pieces: list[Piece], *, record: bool) -> list[Segment]:
        """Tokenize pieces, merge neighbours with the same author, append as segments."""
        pieces = [p for p in pieces if p.text]
        token_lists = self.renderer.encode_pieces([(p.text, p.content) for p in pieces])
        runs: list[tuple[Piece, list[int]]] = []
        for p, ids in zip(pieces, token_lists, strict=True):
            if not ids:
                continue
            key = (p.source, p.step, p.tool_call_id)
            if runs and (runs[-1][0].source, runs[-1][0].step, runs[-1][0].tool_call_id) == key:
                runs[-1][1].extend(ids)
            else:
                runs.append((p, list(ids)))
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
        if record:
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
