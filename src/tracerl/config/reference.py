"""The reference for `tracerl train` configs (docs/config.md), generated from the models.

    python -m tracerl.config.reference           # print it
    python -m tracerl.config.reference --write   # write docs/config.md
    python -m tracerl.config.reference --check   # exit 1 if docs/config.md is out of date

Every field's meaning is its docstring (``use_attribute_docstrings``); `undocumented` lists
the fields that have none, and a contract test keeps that list empty and the file in sync.
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from tracerl.config.annotations import bounds, nested_model, strip_optional, type_name
from tracerl.config.run import RunConfig

DOC_PATH = Path("docs/config.md")

INTRO = """\
# Config reference

`tracerl train CONFIG [KEY=VALUE ...]` reads a run config: a YAML file, then dotted overrides
applied on top of it (`trainer.lr=1e-5`, `rollout.budgets.steps=4`, `model.lora.r=8`; each
value is parsed as YAML, so numbers, booleans, lists and `null` work). Overrides alone, without
a file, start from the defaults below. Unknown keys are refused, and so are values of the
wrong type or out of range: the error names the dotted key and what was expected, before
anything loads. `tracerl train CONFIG --print-config` prints the resolved config (file,
overrides and defaults) without running it. The shipped configs are in `configs/`.

Each section below is one (nested) part of the config, keyed by its dotted path; `[]` marks
the items of a list. A default is written as YAML would write it. Sections whose default is
`null` are off unless given (`warm_start: {}` turns one on with its defaults).

This file is generated from the pydantic models in `tracerl.config` (and the models they
nest): edit the field docstrings there, then run `python -m tracerl.config.reference --write`.
"""


@dataclass(frozen=True)
class _Section:
    path: str  # "" for the top level
    model: type[BaseModel]


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _sections(model: type[BaseModel], path: str = "") -> Iterator[_Section]:
    """The model's section, then each nested model's, depth first in field order."""
    yield _Section(path, model)
    for key, field in model.model_fields.items():
        nested = nested_model(field.annotation)
        if nested is not None:
            yield from _sections(nested[0], _join(path, key) + nested[1])


def undocumented(model: type[BaseModel] = RunConfig) -> list[str]:
    """Dotted keys of every field, nested models included, that has no description."""
    return [
        _join(section.path, key)
        for section in _sections(model)
        for key, field in section.model.model_fields.items()
        if not (field.description or "").strip()
    ]


def _anchor(path: str) -> str:
    """GitHub's anchor for a section heading (punctuation dropped, spaces to dashes)."""
    title = _title(path).replace("`", "").lower()
    return "".join(c for c in title if c.isalnum() or c in "-_ ").replace(" ", "-")


def _title(path: str) -> str:
    return f"`{path}`" if path else "Top level"


def _link(path: str) -> str:
    return f"[`{path}`](#{_anchor(path)})"


def _cell(text: str) -> str:
    return text.replace("|", r"\|")


def _type_cell(field: FieldInfo, key: str) -> str:
    """The field's type; a nested model's links to its section (`key`: the field's path)."""
    nested = nested_model(field.annotation)
    _, optional = strip_optional(field.annotation)
    if nested is not None:
        kind = "list of sections" if nested[1] else "section"
        return f"{kind} {_link(key + nested[1])}" + (" or null" if optional else "")
    limits = bounds(field.metadata)
    name = type_name(field.annotation)
    if limits:  # constraints apply to the value, not to null
        base, opt = strip_optional(field.annotation)
        name = f"{type_name(base)} {limits}" + (" or null" if opt else "")
    return _cell(f"`{name}`")


def _yaml(value: Any) -> str:
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    elif isinstance(value, enum.Enum):
        value = value.value
    text = yaml.safe_dump(value, default_flow_style=True, width=10**9, allow_unicode=True)
    return text.strip().removesuffix("\n...")  # a scalar's document-end marker


def _default_cell(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "*required*"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "*its defaults*"
    return _cell(f"`{_yaml(value)}`")


def _paragraph(text: str | None) -> str:
    return " ".join((text or "").split())


def _section_md(section: _Section) -> str:
    lines = [f"## {_title(section.path)}", ""]
    doc = _paragraph(section.model.__dict__.get("__doc__"))
    if doc:
        lines += [doc, ""]
    lines += ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    for key, field in section.model.model_fields.items():
        type_cell = _type_cell(field, _join(section.path, key))
        meaning = _cell(_paragraph(field.description))
        lines.append(f"| `{key}` | {type_cell} | {_default_cell(field)} | {meaning} |")
    return "\n".join(lines) + "\n"


def render(model: type[BaseModel] = RunConfig) -> str:
    """The whole reference as Markdown."""
    return "\n".join([INTRO, *(_section_md(s) for s in _sections(model))])


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    text = render()
    if args == ["--write"]:
        DOC_PATH.parent.mkdir(parents=True, exist_ok=True)
        DOC_PATH.write_text(text)
        print(f"wrote {DOC_PATH}")
        return 0
    if args == ["--check"]:
        if not DOC_PATH.is_file() or DOC_PATH.read_text() != text:
            print(
                f"{DOC_PATH} is out of date: run python -m tracerl.config.reference --write",
                file=sys.stderr,
            )
            return 1
        return 0
    if args:
        print("usage: python -m tracerl.config.reference [--write | --check]", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
