"""What a config field's annotation says, read once for the reference (docs/config.md) and
for the errors `load_config` writes: whether None is allowed, which section a field holds,
and a readable name for its type (``int ≥ 16 or "auto"``, ``"sync" | "async"``)."""

from __future__ import annotations

import enum
import types
import typing
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel

UNIONS = (typing.Union, types.UnionType)


def strip_optional(ann: Any) -> tuple[Any, bool]:
    """(the annotation without None, whether None was allowed)."""
    if typing.get_origin(ann) in UNIONS:
        args = typing.get_args(ann)
        rest = tuple(a for a in args if a is not type(None))
        if len(rest) < len(args):
            return (rest[0] if len(rest) == 1 else typing.Union[rest]), True  # noqa: UP007
    return ann, False


def is_model(ann: Any) -> bool:
    return isinstance(ann, type) and issubclass(ann, BaseModel)


def nested_model(ann: Any) -> tuple[type[BaseModel], str] | None:
    """The config model a field holds and the path suffix of its section ("" or "[]")."""
    ann, _ = strip_optional(ann)
    if is_model(ann):
        return ann, ""
    if typing.get_origin(ann) is list:
        (item,) = typing.get_args(ann) or (Any,)
        item, _ = strip_optional(item)
        if is_model(item):
            return item, "[]"
    return None


def bounds(metadata: list[Any]) -> str:
    lo = hi = None
    other = []
    for m in metadata:
        if isinstance(m, annotated_types.Ge):
            lo = f"[{m.ge}"
        elif isinstance(m, annotated_types.Gt):
            lo = f"({m.gt}"
        elif isinstance(m, annotated_types.Le):
            hi = f"{m.le}]"
        elif isinstance(m, annotated_types.Lt):
            hi = f"{m.lt})"
        elif isinstance(m, annotated_types.MinLen):
            other.append(f"at least {m.min_length} long")
        elif isinstance(m, annotated_types.MaxLen):
            other.append(f"at most {m.max_length} long")
    if lo and hi:
        other.insert(0, f"in {lo}, {hi}")
    elif lo:
        other.insert(0, ("≥ " if lo[0] == "[" else "> ") + lo[1:])
    elif hi:
        other.insert(0, ("≤ " if hi[-1] == "]" else "< ") + hi[:-1])
    return " ".join(other)


def type_name(ann: Any) -> str:
    """A readable type: ``int``, ``"sync" | "async"``, ``list[str]``, ``mapping``."""
    ann, optional = strip_optional(ann)
    if optional:
        return f"{type_name(ann)} or null"
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin is typing.Annotated:  # a union's constrained member: ``int ≥ 16 or "auto"``
        flat = [c for m in ann.__metadata__ for c in getattr(m, "metadata", [m])]  # Field(ge=)
        limits = bounds(flat)
        return type_name(args[0]) + (f" {limits}" if limits else "")
    if origin is Literal:
        return " | ".join(f'"{a}"' for a in args)
    if isinstance(ann, type) and issubclass(ann, enum.Enum):
        return " | ".join(f'"{m.value}"' for m in ann)
    if origin in UNIONS:
        return " or ".join(type_name(a) for a in args)
    if origin in (list, tuple, set, frozenset):
        return f"list[{type_name(args[0]) if args else 'any'}]"
    if origin is dict or ann is dict:
        return "mapping"
    if ann is Any:
        return "any"
    return getattr(ann, "__name__", str(ann))
