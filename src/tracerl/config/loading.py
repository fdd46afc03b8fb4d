"""Reading a run config: a YAML file and dotted overrides, validated into `RunConfig`.

Whatever does not validate becomes one `ConfigError` that says what, where and what to do:
YAML syntax errors with file, line and column; a key given twice; an empty file; an unknown
key with its line and the closest valid key ("did you mean"); a bad value with the override
or the file line it came from.
"""

from __future__ import annotations

import difflib
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from tracerl.config.annotations import UNIONS, is_model, nested_model, strip_optional, type_name
from tracerl.config.base import ConfigError
from tracerl.config.run import RunConfig

REFERENCE = "docs/config.md lists every key, its type and default"


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``a.b.c=value`` (value parsed as YAML: numbers, booleans, lists, null)."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected key.path=value", "e.g. trainer.lr=1e-5")
        path, raw = item.split("=", 1)
        keys = path.strip().split(".")
        if not all(keys):
            raise ConfigError(f"override {item!r}: empty key in {path!r}", "e.g. trainer.lr=1e-5")
        node = data
        for i, k in enumerate(keys[:-1]):
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                where = ".".join(keys[: i + 1])
                raise ConfigError(
                    f"override {item!r}: {where} is a value, not a section", REFERENCE
                )
        try:
            node[keys[-1]] = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as e:
            raise ConfigError(
                f"override {item!r}: the value is not valid YAML ({_yaml_problem(e)})",
                "quote it: key='text with: colons'",
            ) from None
    return data


def _yaml_problem(e: yaml.YAMLError) -> str:
    return " ".join(str(getattr(e, "problem", None) or e).split())


def _read_yaml(path: Path) -> tuple[dict[str, Any], Any]:
    """The file's mapping and its YAML node tree (for line numbers)."""
    if not path.is_file():
        what = "a folder, not a config file" if path.is_dir() else "no such config file"
        hint = "pass a YAML config, e.g. configs/demo.yaml"
        if (path / "config.yaml").is_file():  # a run's folder
            hint = f"its config is {path / 'config.yaml'} (tracerl train --resume {path})"
        raise ConfigError(f"{path}: {what}", hint)
    try:
        text = path.read_text()
        node = yaml.compose(text)
        _no_duplicate_keys(node, path)
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        raise ConfigError(
            f"{where}: invalid YAML: {_yaml_problem(e)}",
            "fix the file there (indentation, a missing ':' or a stray quote)",
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read it ({e})") from None
    if loaded is None:
        raise ConfigError(
            f"{path}: the file is empty (or only comments)",
            "a config names at least a run: `name: myrun` (docs/config.md lists every key)",
        )
    if not isinstance(loaded, dict):
        raise ConfigError(
            f"{path}: expected a mapping of keys at the top level, got {type(loaded).__name__}",
            "e.g. `name: myrun` / `env: {name: search}`",
        )
    return loaded, node


def _no_duplicate_keys(node: Any, path: Path) -> None:
    """YAML keeps the last of two equal keys, silently: refuse them, naming both lines."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for k, v in node.value:
            if k.value in seen:
                raise ConfigError(
                    f"{path}:{k.start_mark.line + 1}: key {k.value!r} again (first at line "
                    f"{seen[k.value]}); YAML would keep only the last",
                    "merge the two into one",
                )
            seen[k.value] = k.start_mark.line + 1
            _no_duplicate_keys(v, path)
    elif isinstance(node, yaml.SequenceNode):
        for v in node.value:
            _no_duplicate_keys(v, path)


def _empty_sections(data: dict[str, Any], model: type[BaseModel] = RunConfig) -> dict[str, Any]:
    """A section written with every key commented out (``trainer:``) reads as null: it means
    the section's defaults, not "no section" (except for optional sections, where null is
    the way to turn one off, e.g. ``warm_start: null``)."""
    out = dict(data)
    for key, value in data.items():
        field = model.model_fields.get(key)
        ann = field.annotation if field is not None else None
        if is_model(ann):  # a section that cannot be null
            out[key] = _empty_sections(value or {}, ann) if isinstance(value or {}, dict) else value
    return out


def _line(node: Any, loc: tuple[Any, ...]) -> int | None:
    """The line of the key at `loc` in a composed YAML tree (1-based), if it is there."""
    line = None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if k.value == str(part):
                    line, node = k.start_mark.line + 1, v
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if part >= len(node.value):
                return line
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The config model that holds the key at `loc` (for "did you mean")."""
    model: type[BaseModel] = RunConfig
    parts, i = loc[:-1], 0
    while i < len(parts):
        part, i = parts[i], i + 1
        if isinstance(part, int):  # an item of a list section
            continue
        field = model.model_fields.get(part)
        if field is None:
            return None
        found = nested_model(field.annotation)
        if found is not None:
            model = found[0]
        elif (entry := _entry_model(field.annotation)) is not None:
            model, i = entry, i + 1  # a mapping of names to sections: skip the name
        else:
            return None
    return model


def _keys(model: type[BaseModel]) -> list[str]:
    """A section's keys as a config may spell them: a field's alias first where it has one
    (``readOnlyHint``, the MCP spec's name), then its own name."""
    keys: list[str] = []
    for name, field in model.model_fields.items():
        keys += [field.alias, name] if field.alias and field.alias != name else [name]
    return keys


def _entry_model(ann: Any) -> type[BaseModel] | None:
    """The section model of a ``dict[str, Model]`` field (``env.mcp[].annotations``)."""
    ann, _ = strip_optional(ann)
    if typing.get_origin(ann) is dict:
        value, _ = strip_optional(typing.get_args(ann)[-1])
        if is_model(value):
            return value
    return None


def _explain(err: dict[str, Any], origin: str, node: Any) -> tuple[str, str]:
    """One validation error as (what and where, what to do)."""
    loc = tuple(err["loc"])
    key = ".".join(str(p) for p in loc)
    line = _line(node, loc) if node is not None else None
    where = f"{origin}:{line}" if line and not origin.startswith("override") else origin
    if not loc:  # a check across fields
        return f"{where}: {err['msg'].removeprefix('Value error, ')}", REFERENCE
    if err["type"] == "extra_forbidden":
        model = _model_at(loc)
        valid = _keys(model) if model else []
        typo = str(loc[-1])
        close = (
            difflib.get_close_matches(typo, valid, n=1, cutoff=0.6)
            or sorted((k for k in valid if typo.startswith(k) or k.startswith(typo)), key=len)[-1:]
        )  # a key spelled out (rank for r) or cut short
        section = ".".join(str(p) for p in loc[:-1]) or "the top level"
        suggestion = ".".join([*(str(p) for p in loc[:-1]), close[0]]) if close else None
        return (
            f"{where}: unknown key {key!r}"
            + (f"; did you mean {suggestion!r}?" if suggestion else ""),
            f"valid keys of {section}: {', '.join(valid)} ({REFERENCE.split(' lists')[0]})",
        )
    got = repr(err.get("input"))
    got = got if len(got) <= 60 else got[:57] + "..."
    msg = err["msg"].removeprefix("Value error, ")
    return f"{where}: {key}: {msg} (got {got})", REFERENCE


def _leaf(loc: tuple[Any, ...]) -> tuple[tuple[Any, ...], Any] | None:
    """The key at the start of `loc` that is a value, not a section (its path and field), or
    None where `loc` names a section or no field. What follows it in `loc` is pydantic's name
    for a union's member (``constrained-float``, ``literal['auto']``)."""
    model: type[BaseModel] = RunConfig
    for n, part in enumerate(loc):
        if isinstance(part, int):  # an item of a list section
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            return None
        found = nested_model(field.annotation)
        if found is None:
            return loc[: n + 1], field
        model = found[0]
    return None


def _merge_unions(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One error per value that fits none of a union's members (``float ≥ 0 or "auto"``),
    in place of pydantic's one per member, each under the member's name."""
    out: list[dict[str, Any]] = []
    seen: set[tuple[Any, ...]] = set()
    for err in errors:
        leaf = _leaf(tuple(err["loc"]))
        base = strip_optional(leaf[1].annotation)[0] if leaf else None
        if leaf is None or len(err["loc"]) == len(leaf[0]) or typing.get_origin(base) not in UNIONS:
            out.append(err)
        elif leaf[0] not in seen:
            seen.add(leaf[0])
            msg = f"expected {type_name(leaf[1].annotation)}"
            out.append({**err, "loc": leaf[0], "type": "union", "msg": msg})
    return out


def _covers(override: str, loc: tuple[str, ...]) -> bool:
    """Did `override` set the key at `loc` (or a section holding it, or a key inside it)?"""
    keys = tuple(override.split("=", 1)[0].strip().split("."))
    n = min(len(keys), len(loc))
    return n > 0 and keys[:n] == loc[:n]


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> RunConfig:
    """A config from a YAML file and dotted overrides; `ConfigError` (file, line, key and
    what to do) for anything that does not validate."""
    data: dict[str, Any] = {}
    node = None
    if path is not None:
        path = Path(path)
        data, node = _read_yaml(path)
    overrides = list(overrides or [])
    data = _empty_sections(apply_overrides(data, overrides))
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        errors = _merge_unions(list(e.errors()))
        loc = tuple(str(p) for p in errors[0]["loc"])
        from_override = next((o for o in reversed(overrides) if _covers(o, loc)), None)
        origin = f"override {from_override!r}" if from_override else str(path or "config")
        what, todo = _explain(errors[0], origin, None if from_override else node)
        if len(errors) > 1:
            others = ", ".join(
                ".".join(str(p) for p in x["loc"]) or "(config)" for x in errors[1:4]
            )
            what += f" (and {len(errors) - 1} more: {others})"
        raise ConfigError(what, todo) from None
