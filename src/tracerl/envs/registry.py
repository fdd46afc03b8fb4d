"""The environment registry: `register(name, factory)`, `make(name, **kwargs)`.

Strict, like every registry here: registering a name twice raises, and an unknown name raises
listing the valid ones. `make` records how the env was built (``env.spec``) so a receipt can
say how to rebuild it for a live replay.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tracerl.envs.base import Env

_REGISTRY: dict[str, Callable[..., Env]] = {}


def register(name: str, factory: Callable[..., Env]) -> None:
    if name in _REGISTRY:
        raise ValueError(f"environment {name!r} is already registered")
    _REGISTRY[name] = factory


def registered() -> list[str]:
    return sorted(_REGISTRY)


def make(name: str, **kwargs: Any) -> Env:
    """A fresh environment instance (one per episode)."""
    if name not in _REGISTRY:
        valid = ", ".join(registered()) or "none"
        raise KeyError(f"unknown environment {name!r}; registered: {valid}")
    env = _REGISTRY[name](**kwargs)
    env.spec = {"name": name, "kwargs": dict(kwargs)}  # type: ignore[attr-defined]
    return env
