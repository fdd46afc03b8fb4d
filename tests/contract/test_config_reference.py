"""docs/config.md is generated from the config models, documents every field, and covers
every key the shipped configs use."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, ConfigDict

from tracerl.config.reference import DOC_PATH, render, undocumented

CONFIGS = sorted(Path("configs").glob("*.yaml"))


def test_docs_config_md_is_up_to_date():
    assert DOC_PATH.is_file() and DOC_PATH.read_text() == render(), (
        "docs/config.md is out of date: run python -m tracerl.config.reference --write"
    )


def test_every_field_is_documented():
    missing = undocumented()
    assert not missing, (
        f"config fields without a docstring: {', '.join(missing)} (write one under each field, "
        "then run python -m tracerl.config.reference --write)"
    )


class _Inner(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True)

    depth: int = 1
    """Documented."""
    width: int = 2


class _Outer(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True)

    documented: str = "x"
    """Has a docstring."""
    bare: float = 0.5
    inner: _Inner | None = None
    """Documented, but its own field `width` is not."""
    items: list[_Inner] = []
    """A list of sections."""


def test_undocumented_finds_the_missing_docstrings():
    assert undocumented(_Outer) == ["bare", "inner.width", "items[].width"]
    text = render(_Outer)
    assert "## `inner`" in text and "## `items[]`" in text


def test_a_constrained_number_or_auto_reads_as_such():
    """``Annotated[int, Field(ge=16)] | Literal["auto"]`` is ``int ≥ 16 or "auto"`` in the
    table, not the typing construct's name."""
    text = render()
    assert '| `micro_batch_tokens` | `int ≥ 16 or "auto"` |' in text
    assert '| `prefix_cache_gb` | `float ≥ 0 or "auto"` | `auto` |' in text
    assert "Annotated" not in text


def _reference_keys(text: str) -> tuple[set[str], set[str]]:
    """(every dotted key in the rendered tables, every section path)."""
    keys: set[str] = set()
    sections: set[str] = set()
    section = None
    for line in text.splitlines():
        if m := re.fullmatch(r"## `(.+)`", line):
            section = m[1]
            sections.add(section)
        elif line == "## Top level":
            section = ""
        elif section is not None and (m := re.match(r"\| `([^`]+)` \|", line)):
            keys.add(f"{section}.{m[1]}" if section else m[1])
    return keys, sections


def _yaml_keys(node: Any, prefix: str, sections: set[str]) -> list[str]:
    """Dotted keys of a YAML mapping, descending only into documented sections (a free-form
    mapping such as ``env.kwargs`` is one key)."""
    out = []
    for k, v in node.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        out.append(key)
        if isinstance(v, dict) and key in sections:
            out += _yaml_keys(v, key, sections)
        elif isinstance(v, list) and f"{key}[]" in sections:
            for item in v:
                out += _yaml_keys(item, f"{key}[]", sections)
    return out


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_config_keys_are_in_the_reference(path):
    keys, sections = _reference_keys(render())
    used = _yaml_keys(yaml.safe_load(path.read_text()), "", sections)
    assert used, f"{path} holds no keys"
    missing = [k for k in used if k not in keys]
    assert not missing, f"{path}: keys missing from the reference: {missing}"


def test_the_key_walk_is_not_vacuous():
    keys, sections = _reference_keys(render())
    assert {"trainer.lr", "rollout.budgets.steps", "trainer.reward_components[].fn"} <= keys
    assert {"model.lora", "trainer.reward_components[]", "rollout.budgets"} <= sections
    data = {"env": {"kwargs": {"corpus": "x"}}, "trainer": {"reward_components": [{"fn": "f"}]}}
    assert _yaml_keys(data, "", sections) == [
        "env",
        "env.kwargs",
        "trainer",
        "trainer.reward_components",
        "trainer.reward_components[].fn",
    ]
