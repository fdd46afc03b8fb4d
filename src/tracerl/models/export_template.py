"""The chat template an export ships: the one the run rendered with, made to render tools.

A run renders its prompts with `ChatRenderer`. For a chat template that does not render
``tools`` (SmolLM2's), the renderer writes the tool list into the prompt itself
(`tools_block`: appended to the first system message after a blank line, or a system message
of its own), so the base template alone silently drops ``apply_chat_template(messages,
tools=...)``'s tools, and a served export would never be told it has any.

`export_chat_template` returns the base template behind a Jinja prelude that rebuilds
``messages`` the way the renderer hands them to the template, then lets the base template
render them unchanged:

* ``tools`` given and non-empty: the tools block joins the messages exactly as
  `ChatRenderer.render_text` puts it there, one ``json.dumps(tool, ensure_ascii=False)`` line
  per tool (transformers' ``tojson`` filter, which vLLM renders with too, is that call).
* an assistant message carrying OpenAI-style ``tool_calls`` (what a client sends back) whose
  content does not already spell the calls: the calls are written in the run's tool-call
  format (``json_list``: one ``<tool_call>[...]</tool_call>``; ``hermes``: one block per
  call), as `tracerl.envs.parsers`' ``format_calls`` writes them, after the content and a
  newline. ``arguments`` as a dict (vLLM parses them) is written as ``json.dumps`` does; as
  a JSON string (transformers passes them through) it is written as given.
* every message reaches the base template as the renderer passes it: role, content (``None``
  as empty; OpenAI content parts joined by newlines, as vLLM joins them), ``tool_call_id``
  and ``name``.

Without tools and tool calls the export renders exactly what the base template does.
Templates that render ``tools`` themselves (Qwen's) are returned unchanged: the renderer hands
them ``tools=`` and they render tool calls in their own format.

The parser is given by name (this layer does not import the parsers).
"""

from __future__ import annotations

import json

from tracerl.models.render import ChatRenderer, tools_block

CALL_FORMATS = ("json_list", "hermes")
"""Tool-call formats the prelude can write back (the others' assistant turns pass as is)."""

_MARK = "@@tracerl-tools@@"


def _literal(text: str) -> str:
    """`text` as a Jinja string literal (Jinja reads Python escapes; JSON's are a subset)."""
    return json.dumps(text, ensure_ascii=False)


def _tools_block_parts() -> tuple[str, str]:
    """`tools_block`'s text before and after its tool lines."""
    head, tail = tools_block([_MARK]).split(json.dumps(_MARK))  # type: ignore[list-item]
    return head, tail


def _calls_jinja(parser: str | None) -> str:
    """Jinja that sets ``_tr.calls`` to an assistant message's ``tool_calls`` as text."""
    if parser not in CALL_FORMATS:
        return "{%- set _tr.calls = '' -%}\n"
    if parser == "json_list":
        join = "{%- set _tr.calls = '<tool_call>[' ~ (_tr.items | join(', ')) ~ ']</tool_call>' -%}"
    else:
        join = (
            "{%- set _tr.calls = '<tool_call>\\n' ~ (_tr.items | join('\\n</tool_call>\\n"
            "<tool_call>\\n')) ~ '\\n</tool_call>' -%}"
        )
    return (
        "{%- set _tr.items = [] -%}\n"
        "{%- for _call in _m.tool_calls -%}\n"
        "{%- set _f = _call.function if _call.function is defined else _call -%}\n"
        "{%- if _f.arguments is not defined or _f.arguments is none -%}"
        "{%- set _args = '{}' -%}\n"
        "{%- elif _f.arguments is string -%}{%- set _args = _f.arguments -%}\n"
        "{%- else -%}{%- set _args = _f.arguments | tojson(ensure_ascii=True) -%}{%- endif -%}\n"
        "{%- set _tr.items = _tr.items + ['{\"name\": ' ~ (_f.name | tojson(ensure_ascii=True))"
        " ~ ', \"arguments\": ' ~ _args ~ '}'] -%}\n"
        "{%- endfor -%}\n" + join + "\n"
    )


def _prelude(parser: str | None) -> str:
    head, tail = _tools_block_parts()
    return (
        "{#- tracerl export: messages and tools as the run rendered them "
        "(tracerl.models.export_template); the model's own template follows. -#}\n"
        "{%- set _tr = namespace(msgs=[], lines=[], items=[], calls='') -%}\n"
        "{%- for _m in messages -%}\n"
        "{%- if _m.content is not defined or _m.content is none -%}{%- set _text = '' -%}\n"
        "{%- elif _m.content is string -%}{%- set _text = _m.content -%}\n"
        "{%- else -%}{%- set _text = _m.content | map(attribute='text') | join('\\n') -%}"
        "{%- endif -%}\n"
        "{%- if _m.role == 'assistant' and _m.tool_calls is defined and _m.tool_calls "
        "and '<tool_call>' not in _text -%}\n"
        + _calls_jinja(parser)
        + "{%- if _tr.calls -%}{%- set _text = (_text ~ '\\n' if _text else '') ~ _tr.calls -%}"
        "{%- endif -%}\n"
        "{%- endif -%}\n"
        "{%- set _d = {'role': _m.role, 'content': _text} -%}\n"
        "{%- if _m.tool_call_id is defined and _m.tool_call_id is not none -%}"
        "{%- set _d = dict(_d, tool_call_id=_m.tool_call_id) -%}{%- endif -%}\n"
        "{%- if _m.name is defined and _m.name is not none -%}"
        "{%- set _d = dict(_d, name=_m.name) -%}{%- endif -%}\n"
        "{%- set _tr.msgs = _tr.msgs + [_d] -%}\n"
        "{%- endfor -%}\n"
        "{%- if tools is defined and tools -%}\n"
        "{%- for _t in tools -%}{%- set _tr.lines = _tr.lines + [_t | tojson] -%}"
        "{%- endfor -%}\n"
        f"{{%- set _block = {_literal(head)} ~ (_tr.lines | join('\\n')) ~ {_literal(tail)} -%}}\n"
        "{%- if _tr.msgs and _tr.msgs[0].role == 'system' -%}\n"
        "{%- set _tr.msgs = [dict(_tr.msgs[0], content=_tr.msgs[0].content ~ '\\n\\n' ~ _block)]"
        " + _tr.msgs[1:] -%}\n"
        "{%- else -%}\n"
        "{%- set _tr.msgs = [{'role': 'system', 'content': _block}] + _tr.msgs -%}\n"
        "{%- endif -%}\n"
        "{%- endif -%}\n"
        "{%- set messages = _tr.msgs -%}\n"
    )


def export_chat_template(renderer: ChatRenderer, parser: str | None) -> str:
    """The chat template to ship with an export of a run that rendered with `renderer` and
    trained its policy to call tools in format `parser` (a `tracerl.envs.parsers` name, or
    None): the base template when it renders tools itself, else the base template behind a
    prelude that renders tools and tool calls as the run did (see the module's docstring)."""
    if renderer.renders_tools:
        return renderer.chat_template
    return _prelude(parser) + renderer.chat_template
