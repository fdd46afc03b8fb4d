"""The chat renderer: messages in, provenance-tagged token segments out.

How each kind of token is produced (and so who authored it):

* The initial messages are rendered by the model's own chat template and tokenized as the
  `prompt`; the generation prompt that follows (e.g. ``<|im_start|>assistant\\n``) is `template`.
* A model turn is the sampler's token ids, appended verbatim as a `policy` segment. They are
  never decoded and re-encoded: decoding only produces the *message* the template needs to
  render what comes next.
* An observation (tool results, a later user or system turn) is appended as the exact token
  delta the template adds after the model's turn: whatever closes the model's turn that the
  model did not sample itself (``\\n`` after ``<|im_end|>``, or the whole turn end when the
  turn was cut by the token limit), then the template's scaffold (`template`) around each
  message's content (`environment`), then the next generation prompt (`template`).

To find which characters of that delta are content and which are scaffold, the renderer
renders the same conversation a second time with every observation's content replaced by a
unique sentinel, and checks that putting the real contents back reproduces the real render
exactly. Nothing is found by searching strings after the fact.

Content tokens are tokenized with special tokens *split*: a tool result that contains the
text ``<|im_end|>`` cannot forge a turn end. Scaffold tokens are tokenized with special tokens
parsed, as the template intends.

Prefix property: appending messages must not change how the earlier conversation renders.
Templates that break it (Qwen3 drops the ``<think>`` blocks of earlier turns once a new user
query arrives) are detected on every observation. The renderer then closes the current sample
and starts a new one whose prompt is the re-rendered conversation (``on_prefix_break=
"new_sample"``, the default), or raises (``"raise"``). It never silently splices.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from tracerl.types import Segment, Source, ToolCall, Trajectory, TrajectoryError

ROLES = ("system", "user", "assistant", "tool")
OBSERVATION_ROLES = ("tool", "user", "system")
# Letters and digits only, so the sentinel survives `| trim`, `| tojson` and HTML escaping.
_SENTINEL = "TRACERLSENTINEL{}Q"
_SENTINEL_RE = re.compile(r"TRACERLSENTINEL(\d+)Q")

PrefixBreakPolicy = Literal["new_sample", "raise"]


def tools_block(tools: Sequence[dict[str, Any]]) -> str:
    """System-prompt text describing tools, for chat templates that do not render `tools`.

    The call format is a JSON list inside ``<tool_call>`` tags (SmolLM2's function-calling
    form).
    """
    lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (
        "You can call tools. Their JSON schemas:\n<tools>\n"
        f"{lines}\n</tools>\n"
        "To call tools, answer with a JSON list inside <tool_call></tool_call> tags, e.g.\n"
        '<tool_call>[{"name": "tool_name", "arguments": {"arg": "value"}}]</tool_call>'
    )


@dataclass(frozen=True)
class _Piece:
    text: str
    source: Source
    step: int
    tool_call_id: str | None = None
    content: bool = False  # tokenized with special tokens split
    ids: tuple[int, ...] | None = None  # already tokens (the unsampled end of a model turn)


class ChatRenderer:
    """Renders conversations with a chat template into provenance-tagged segments.

    Args:
        tokenizer: a Hugging Face tokenizer (fast tokenizers recommended).
        chat_template: Jinja source; defaults to the tokenizer's own.
        template_kwargs: extra template variables (e.g. ``enable_thinking=False``). For
            templates that print today's date, ``date_string`` is frozen per conversation so a
            long episode cannot straddle midnight and break its own prefix.
        on_prefix_break: what to do when the template re-renders earlier turns differently.
    """

    def __init__(
        self,
        tokenizer: Any,
        chat_template: str | None = None,
        *,
        template_kwargs: dict[str, Any] | None = None,
        on_prefix_break: PrefixBreakPolicy = "new_sample",
    ) -> None:
        template = chat_template or getattr(tokenizer, "chat_template", None)
        if not template:
            raise TrajectoryError(
                "renderer: the tokenizer has no chat template; pass chat_template= "
                "(Jinja source) to ChatRenderer"
            )
        if on_prefix_break not in ("new_sample", "raise"):
            raise ValueError(
                f"on_prefix_break must be 'new_sample' or 'raise', not {on_prefix_break!r}"
            )
        self.tokenizer = tokenizer
        self.chat_template: str = template
        self.template_hash = hashlib.sha256(template.encode()).hexdigest()
        self.template_kwargs = dict(template_kwargs or {})
        self.on_prefix_break: PrefixBreakPolicy = on_prefix_break
        self.renders_tools = re.search(r"\btools\b", template) is not None
        self._date_in_template = "date_string" in template or "strftime_now" in template
        self.stop_token_ids: frozenset[int] = frozenset(self._turn_end_ids())

    # ---- public entry --------------------------------------------------------------------
    def start(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None = None,
        *,
        episode_id: str | None = None,
    ) -> Conversation:
        """Begin a conversation: renders `messages` (and `tools`) as the prompt."""
        return Conversation(self, messages, tools, episode_id=episode_id)

    # ---- rendering helpers (used by Conversation) ------------------------------------------
    def render_text(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None,
        *,
        add_generation_prompt: bool,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        msgs = [_template_message(m) for m in messages]
        if tools and not self.renders_tools:
            block = tools_block(tools)
            if msgs and msgs[0]["role"] == "system":
                msgs[0] = {**msgs[0], "content": msgs[0]["content"] + "\n\n" + block}
            else:
                msgs.insert(0, {"role": "system", "content": block})
        kwargs = {**self.template_kwargs, **(template_kwargs or {})}
        try:
            out = self.tokenizer.apply_chat_template(
                msgs,
                tools=list(tools) if tools and self.renders_tools else None,
                chat_template=self.chat_template,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                **kwargs,
            )
        except Exception as e:  # jinja errors and raise_exception() from templates
            raise TrajectoryError(
                f"chat template failed on {len(msgs)} messages: {type(e).__name__}: {e}"
            ) from e
        if not isinstance(out, str):  # some versions return a list for batched input
            out = out[0]
        return out

    def encode(self, text: str, *, content: bool) -> list[int]:
        """Tokenize `text`. Content (from tools or users) never forms special tokens."""
        if not text:
            return []
        kw: dict[str, Any] = {"add_special_tokens": False}
        if content:
            kw["split_special_tokens"] = True
        return list(self.tokenizer(text, **kw)["input_ids"])

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=False)

    def closing_text(
        self, history: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None, **kw: Any
    ) -> str:
        """Text the template puts after an assistant turn's content (e.g. ``<|im_end|>\\n``)."""
        sentinel = _SENTINEL.format(0)
        msgs = [*history, {"role": "assistant", "content": sentinel}]
        text = self.render_text(msgs, tools, add_generation_prompt=False, template_kwargs=kw)
        at = text.rfind(sentinel)
        if at < 0:
            raise TrajectoryError("renderer: the chat template dropped the assistant's content")
        return text[at + len(sentinel) :]

    def _turn_end_ids(self) -> set[int]:
        """Token ids that end a model turn: eos, and the first token of the template's close."""
        ids: set[int] = set()
        eos = getattr(self.tokenizer, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        try:
            kw = {"date_string": "01 Jan 2026"} if self._date_in_template else {}
            close = self.closing_text([{"role": "user", "content": "hi"}], None, **kw)
        except TrajectoryError:
            return ids
        close_ids = self.encode(close, content=False)
        if close_ids and close_ids[0] in set(getattr(self.tokenizer, "all_special_ids", [])):
            ids.add(close_ids[0])
        return ids


def _template_message(m: dict[str, Any]) -> dict[str, Any]:
    """What the template sees. Assistant turns are rendered from their sampled text only: the
    raw text already contains the model's calls, and passing `tool_calls` as well would make
    templates such as Qwen's render each call twice."""
    out = {"role": m["role"], "content": m["content"]}
    for key in ("tool_call_id", "name"):
        if m.get(key) is not None:
            out[key] = m[key]
    return out


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
        if renderer._date_in_template and "date_string" not in renderer.template_kwargs:
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
            steps=tuple(self._steps),
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
        seg = Segment(
            Source.POLICY,
            tuple(ids),
            tuple(logprobs),
            step=self.step,
            text=text,
            policy_version=policy_version,
            finish_reason=finish_reason,
        )
        seg.validate(where=where)
        calls = [c if isinstance(c, ToolCall) else ToolCall.from_dict(c) for c in tool_calls]
        seen = set()
        for c in calls:
            if c.id in seen or c.id in self.open_calls:
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
            {**m, "content": _SENTINEL.format(i)}
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
        parts = _SENTINEL_RE.split(sent[offset:])  # scaffold, idx, scaffold, idx, ..., scaffold
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
            text = _match_content(msg["content"], target, cursor, following)
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


def _match_content(content: str, target: str, cursor: int, following: str) -> str | None:
    """The form of `content` the template printed at `cursor`: verbatim, whitespace-trimmed
    (Llama's ``| trim``) or JSON-escaped (Llama 3.2 prints tool results with ``| tojson``; the
    quotes are scaffold), checked against the scaffold that follows."""
    escaped = json.dumps(content, ensure_ascii=False)[1:-1]
    forms = (content, content.strip(), content.lstrip(), content.rstrip(), escaped)
    for variant in dict.fromkeys(forms):
        if target.startswith(variant, cursor) and target.startswith(
            following, cursor + len(variant)
        ):
            return variant
    return None


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
