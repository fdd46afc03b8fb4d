"""Action parsers: the policy's sampled text in, an `Action` value out.

Which parser reads a model's turns depends on the model family's tool-call format:

* ``hermes`` — Hermes/Qwen: one JSON object per ``<tool_call>{...}</tool_call>`` block.
* ``json_list`` — SmolLM2: a JSON list of calls inside one ``<tool_call>[...]</tool_call>``.
* ``search_r1`` — Search-R1 tags: ``<search>query</search>`` or ``<answer>text</answer>``.

For the tool-call formats, a turn without any call is the final answer. A malformed turn is
not an exception: the parser returns an `Action` whose `error` says what was wrong; the runner
shows that message to the model as an observation and attributes it to the policy.

Parsing only reads text to decide *what the model asked for*; it never touches tokens or
masks (those were fixed when the tokens were sampled).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tracerl.errors import UserError
from tracerl.types import Fault, FaultKind, ToolCall


@dataclass(frozen=True)
class Action:
    """What one model turn asks for: tool calls, a final answer, or nothing usable.

    Attributes:
        text: the turn's text (stop token excluded).
        tool_calls: the calls, in order, with ids ``call_<step>_<i>``.
        answer: the final answer, when the turn gives one.
        error: a `ParseError` when the turn could not be read.
    """

    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    answer: str | None = None
    error: Fault | None = None

    @property
    def is_final(self) -> bool:
        return self.error is None and not self.tool_calls and self.answer is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "parse_error" if self.error else "tool_calls" if self.tool_calls else "answer",
            "tool_calls": [c.to_dict() for c in self.tool_calls],
            "answer": self.answer,
            "error": self.error.to_dict() if self.error else None,
        }


class ParseError(Fault):
    """A model turn that could not be read: a `parse_error` fault, owned by the policy. It is
    a value (`Action.error`), shown to the model as an observation, never raised."""

    def __init__(self, message: str) -> None:
        super().__init__(FaultKind.PARSE_ERROR, message)


def parse_error(text: str, message: str) -> Action:
    return Action(text=text, error=ParseError(message))


class ActionParser(Protocol):
    name: str

    def parse(self, text: str, *, step: int) -> Action: ...

    def format_calls(self, calls: Sequence[tuple[str, dict[str, Any]]]) -> str:
        """The text a model of this family writes to make these calls (scripts, SFT data)."""
        ...

    def format_answer(self, answer: str) -> str: ...

    def strip_calls(self, text: str) -> str:
        """`text` without its tool calls: the ``content`` an OpenAI-style answer carries
        beside its ``tool_calls`` (`tracerl.gateway`)."""
        ...


_TAG = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def _call(item: Any, step: int, i: int, raw: str) -> ToolCall | str:
    """One call object, or the reason it is not one."""
    if not isinstance(item, dict):
        return f"call {i} is {type(item).__name__}, expected an object"
    name, args = item.get("name"), item.get("arguments", {})
    if isinstance(args, str):  # some models double-encode arguments
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return f"call {i}: 'arguments' is a string that is not JSON"
    if not isinstance(name, str) or not name:
        return f"call {i} has no 'name'"
    if not isinstance(args, dict):
        return f"call {i}: 'arguments' must be an object"
    return ToolCall(f"call_{step}_{i}", name, args, raw=raw)


def _json(raw: str) -> Any:
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as e:
        return ValueError(f"invalid JSON in <tool_call> ({e.msg} at column {e.colno})")
    except RecursionError:  # thousands of nested brackets: the model's, not a crash
        return ValueError("invalid JSON in <tool_call> (nested too deeply)")
    try:  # a lone surrogate (``"\\ud800"``) is no text: it could not be sent or stored
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except (UnicodeEncodeError, RecursionError):
        return ValueError("invalid JSON in <tool_call> (an escape that is not a character)")
    return value


class _TaggedJsonParser:
    """Shared logic of `hermes` and `json_list`: JSON inside ``<tool_call>`` tags."""

    name = ""
    lists = False

    def parse(self, text: str, *, step: int) -> Action:
        blocks = list(_TAG.finditer(text))
        if not blocks:
            if "<tool_call>" in text or "</tool_call>" in text:
                return parse_error(text, "unbalanced <tool_call> tag; close every call")
            return Action(text=text, answer=text.strip())
        calls: list[ToolCall] = []
        for block in blocks:
            raw = block.group(1)
            value = _json(raw.strip())
            if isinstance(value, ValueError):
                return parse_error(text, str(value))
            items = value if isinstance(value, list) else [value]
            if not self.lists and isinstance(value, list):
                return parse_error(text, "one JSON object per <tool_call> block, not a list")
            for item in items:
                call = _call(item, step, len(calls), raw)
                if isinstance(call, str):
                    return parse_error(text, call)
                calls.append(call)
        if not calls:
            return parse_error(text, "empty <tool_call> block")
        return Action(text=text, tool_calls=tuple(calls))

    def format_answer(self, answer: str) -> str:
        return answer

    def strip_calls(self, text: str) -> str:
        return _TAG.sub("", text).strip()


class HermesParser(_TaggedJsonParser):
    name = "hermes"

    def format_calls(self, calls: Sequence[tuple[str, dict[str, Any]]]) -> str:
        return "\n".join(
            "<tool_call>\n" + json.dumps({"name": n, "arguments": a}) + "\n</tool_call>"
            for n, a in calls
        )


class JsonListParser(_TaggedJsonParser):
    name = "json_list"
    lists = True

    def format_calls(self, calls: Sequence[tuple[str, dict[str, Any]]]) -> str:
        items = [{"name": n, "arguments": a} for n, a in calls]
        return f"<tool_call>{json.dumps(items)}</tool_call>"


class SearchR1Parser:
    """``<search>q</search>`` is a call to the ``search`` tool; ``<answer>a</answer>`` ends.

    Reasoning in ``<think>...</think>`` is allowed around either. A turn with both, or with
    neither, is a parse error (Search-R1 asks for exactly one action per turn).
    """

    name = "search_r1"
    tool_name = "search"
    _search = re.compile(r"<search>(.*?)</search>", re.DOTALL)
    _answer = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)

    def parse(self, text: str, *, step: int) -> Action:
        searches = list(self._search.finditer(text))
        answers = list(self._answer.finditer(text))
        if searches and answers:
            return parse_error(text, "a turn either searches or answers, not both")
        if len(searches) > 1 or len(answers) > 1:
            return parse_error(text, "one <search> or <answer> per turn")
        if answers:
            return Action(text=text, answer=answers[0].group(1).strip())
        if searches:
            query = searches[0].group(1).strip()
            if not query:
                return parse_error(text, "empty <search></search>; write a query inside")
            call = ToolCall(
                f"call_{step}_0", self.tool_name, {"query": query}, raw=searches[0].group(0)
            )
            return Action(text=text, tool_calls=(call,))
        return parse_error(
            text,
            "no action found: search with <search>query</search> or finish with "
            "<answer>text</answer>",
        )

    def format_calls(self, calls: Sequence[tuple[str, dict[str, Any]]]) -> str:
        if len(calls) != 1 or calls[0][0] != self.tool_name:
            raise ValueError("search_r1 turns make exactly one 'search' call")
        return f"<search>{calls[0][1]['query']}</search>"

    def format_answer(self, answer: str) -> str:
        return f"<answer>{answer}</answer>"

    def strip_calls(self, text: str) -> str:
        return self._search.sub("", text).strip()


PARSERS: dict[str, type[ActionParser]] = {
    "hermes": HermesParser,
    "json_list": JsonListParser,
    "search_r1": SearchR1Parser,
}
# Default parser per model family (matched on the model id, lower-cased).
FAMILY_PARSERS = {
    "smollm2": "json_list",
    "qwen": "hermes",
    "tiny-random": "json_list",
    "tiny-chars": "json_list",
}


def get_parser(name: str) -> ActionParser:
    if name not in PARSERS:
        raise KeyError(f"unknown action parser {name!r}; valid: {', '.join(sorted(PARSERS))}")
    return PARSERS[name]()


class NoParserError(UserError, KeyError):
    """No tool-call parser is named for a model, and none is known for it."""

    def __str__(self) -> str:  # KeyError would quote the message
        return self.message


def parser_for_model(model_id: str) -> ActionParser:
    """The tool-call parser for a model: the one a tracerl export names (``parser`` in its
    ``tracerl_export.json``: the format its run trained it on), else its family's (matched
    on the spec of a model tracerl ships), else `NoParserError` saying which key to set. A
    folder's name says nothing: an export named anything finds its parser. A run's
    checkpoint (``run:runs/NAME@7``, a checkpoint folder) parses as its run trained: the
    run's ``env.parser``, else its base model's parser (`run_parser`)."""
    from tracerl.models.refs import is_checkpoint_ref

    if is_checkpoint_ref(model_id):
        named = run_parser(model_id)
        if named is not None:
            return get_parser(named)
    elif model_id.startswith("hf:"):
        named = _exported_parser(Path(model_id[3:]).expanduser())
        if named is not None:
            return get_parser(named)
    else:
        low = model_id.lower()
        for family, parser in FAMILY_PARSERS.items():
            if family in low:
                return get_parser(parser)
    raise NoParserError(
        f"no tool-call parser is known for model {model_id!r}",
        f"set env.parser to the format it writes tool calls in: {', '.join(sorted(PARSERS))}",
    )


def run_parser(ref: str) -> str | None:
    """The tool-call format the run of checkpoint `ref` (``run:...``, a checkpoint folder)
    trained its policy in: its config's ``env.parser``, else its base model's
    (`parser_for_model`); None: neither names one. `ModelNotFoundError` for a checkpoint
    that is not there."""
    import yaml

    from tracerl.models.refs import parse_model_ref

    model = parse_model_ref(ref)
    assert model.run_dir is not None
    try:
        env = (yaml.safe_load((model.run_dir / "config.yaml").read_text()) or {}).get("env")
    except (OSError, yaml.YAMLError):
        env = None
    named = (env or {}).get("parser") if isinstance(env, dict) else None
    if named in PARSERS:
        return str(named)
    try:
        return parser_for_model(model.spec).name
    except NoParserError:
        return None


def _exported_parser(folder: Path) -> str | None:
    """The parser a tracerl export's metadata names (None: not an export, or none named)."""
    from tracerl.models.refs import EXPORT_FILE

    meta = folder / EXPORT_FILE
    try:
        named = json.loads(meta.read_text()).get("parser") if meta.is_file() else None
    except (OSError, ValueError):
        return None
    return named if named in PARSERS else None
