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

The token stream is the anchor: an observation is appended only if rendering the conversation
with it *starts with* the text the stream already spells (everything up to the model's turn,
then the model's own text). If not, the template is not prefix-preserving here (Qwen3 drops
earlier ``<think>`` blocks once a new user query arrives; Llama trims assistant turns;
DeepSeek-R1 drops reasoning): the renderer closes the current sample and starts a new one
whose prompt is the conversation as the template now renders it (``on_prefix_break=
"new_sample"``, the default), or raises (``"raise"``). It never silently splices.

To find which characters of a delta are content and which are scaffold, the conversation is
rendered a second time with each new message's content replaced by a sentinel (with a random
nonce); putting the real contents back must reproduce the real render exactly, and a message
the template drops is refused. Nothing is found by searching strings after the fact.

Tokenization: a delta is tokenized in one go, exactly as tokenizing the rendered text would,
and each token goes to the piece where its first character lies. Content never forms control
tokens: when it contains control-token text (``<|im_end|>``, or Qwen's non-special
``<tool_call>``), pieces are tokenized one by one and that text is split.
"""

from __future__ import annotations

import hashlib
import json
import re
from bisect import bisect_right
from collections.abc import Sequence
from typing import Any

from tracerl.models.attribution import Sentinels
from tracerl.models.conversation import Conversation
from tracerl.models.roles import PrefixBreakPolicy
from tracerl.types import TrajectoryError


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
        self.warned_prefix_break = False
        added = sorted(
            (t for t in getattr(tokenizer, "get_added_vocab", dict)() if len(t) > 1),
            key=len,
            reverse=True,
        )
        self._added_re = re.compile("|".join(map(re.escape, added))) if added else None
        special = sorted(
            (t for t in getattr(tokenizer, "all_special_tokens", ()) if len(t) > 1),
            key=len,
            reverse=True,
        )
        self._special_re = re.compile("|".join(map(re.escape, special))) if special else None
        self.renders_tools = re.search(r"\btools\b", template) is not None
        self.prints_date = "date_string" in template or "strftime_now" in template
        self.stop_token_ids: frozenset[int] = frozenset(self._turn_end_ids())

    # ---- public entry --------------------------------------------------------------------
    def start(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None = None,
        *,
        episode_id: str | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> Conversation:
        """Begin a conversation: renders `messages` (and `tools`) as the prompt.

        `template_kwargs` replaces the per-conversation template values (the frozen date);
        replay passes the recorded ones."""
        return Conversation(
            self, messages, tools, episode_id=episode_id, template_kwargs=template_kwargs
        )

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
        """Tokenize `text`. Content (from tools or users) never forms control tokens: special
        tokens are split, and so are added tokens that are not special (Qwen's `<tool_call>`,
        `</tool_response>`, `<think>` ...), by encoding their first character apart."""
        if not text:
            return []
        if not content:
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        out: list[int] = []
        pos = 0
        for m in self._added_re.finditer(text) if self._added_re else ():
            out += self._encode_plain(text[pos : m.start()])
            out += self._encode_plain(m.group()[0]) + self.encode(m.group()[1:], content=True)
            pos = m.end()
        return out + self._encode_plain(text[pos:])

    def _encode_plain(self, text: str) -> list[int]:
        if not text:
            return []
        kw = {"add_special_tokens": False, "split_special_tokens": True}
        return list(self.tokenizer(text, **kw)["input_ids"])

    def encode_pieces(self, pieces: Sequence[tuple[str, bool]]) -> list[list[int]]:
        """Tokenize consecutive `(text, is_content)` pieces; one id list per piece.

        The usual case tokenizes the whole chunk at once, exactly as tokenizing the rendered
        conversation would, and gives each token to the piece where its first character lies
        (a token that merges across a boundary, such as two newlines, goes to the first).
        When some content contains control-token text, pieces are tokenized one by one so the
        content cannot form control tokens.
        """
        texts = [t for t, _ in pieces]
        if self._content_forms_control_text(pieces) or not getattr(self.tokenizer, "is_fast", 0):
            return [self.encode(t, content=c) for t, c in pieces]
        enc = self.tokenizer("".join(texts), add_special_tokens=False, return_offsets_mapping=True)
        starts, owners, at = [], [], 0
        for i, t in enumerate(texts):
            if t:
                starts.append(at)
                owners.append(i)
            at += len(t)
        out: list[list[int]] = [[] for _ in texts]
        owner = owners[0] if owners else 0
        for tid, (lo, hi) in zip(enc["input_ids"], enc["offset_mapping"], strict=True):
            if hi > lo:
                owner = owners[bisect_right(starts, lo) - 1]
            out[owner].append(tid)
        return out

    def _content_forms_control_text(self, pieces: Sequence[tuple[str, bool]]) -> bool:
        """Would tokenizing the joined pieces turn any content character into part of a
        control token? (Checked on the joined text: control text can straddle two pieces.)"""
        if self._added_re is None:
            return False
        joined, spans, at = "", [], 0
        for text, is_content in pieces:
            if is_content:
                spans.append((at, at + len(text)))
            joined += text
            at += len(text)
        return any(
            lo < m.end() and m.start() < hi
            for m in self._added_re.finditer(joined)
            for lo, hi in spans
        )

    def spells_special(self, text: str) -> bool:
        """Does `text` hold a special token's text (``<|im_end|>``, the eos)?"""
        return self._special_re is not None and self._special_re.search(text) is not None

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=False)

    def _turn_end_ids(self) -> set[int]:
        """Token ids that end a model turn: eos, and the first token the template puts after an
        assistant turn's content (e.g. ``<|im_end|>``), found by rendering a sentinel."""
        ids: set[int] = set()
        eos = getattr(self.tokenizer, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        sentinel = Sentinels()(0)
        msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": sentinel}]
        kw = {"date_string": "01 Jan 2026"} if self.prints_date else {}
        try:
            text = self.render_text(msgs, None, add_generation_prompt=False, template_kwargs=kw)
        except TrajectoryError:
            return ids
        at = text.rfind(sentinel)
        close_ids = self.encode(text[at + len(sentinel) :], content=False) if at >= 0 else []
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
