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

import hashlib
import json
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from tracerl.types import TrajectoryError

if TYPE_CHECKING:
    from tracerl.models.conversation import Conversation

ROLES = ("system", "user", "assistant", "tool")
OBSERVATION_ROLES = ("tool", "user", "system")
# Letters and digits only, so the sentinel survives `| trim`, `| tojson` and HTML escaping.
SENTINEL = "TRACERLSENTINEL{}Q"
SENTINEL_RE = re.compile(r"TRACERLSENTINEL(\d+)Q")

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
    ) -> Conversation:
        """Begin a conversation: renders `messages` (and `tools`) as the prompt."""
        from tracerl.models.conversation import Conversation

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
        sentinel = SENTINEL.format(0)
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
            kw = {"date_string": "01 Jan 2026"} if self.prints_date else {}
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


def match_content(content: str, target: str, cursor: int, following: str) -> str | None:
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
