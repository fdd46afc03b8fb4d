"""Environments by name: the built-ins, installed packages' entry points, import paths.

    make("refund_desk")                      # registered with `register(name, factory)`
    make("unitconv")                         # an entry point of group ``tracerl.envs``
    make("mypkg.envs:UnitConv", scale=2)     # an import path (class or factory)

The three resolve in that order. A ``python:<qualname>`` name is an object `tracerl.train`
was given (a class defined in a notebook or a test) and registered for its process only:
elsewhere it is an error that says how to give it again. `make` records how the env was
built (``env.spec``: name, kwargs and the import path of its factory) so a receipt can say
how to rebuild it, in another process, for a live replay or on a Ray worker. An unknown
name raises listing the valid ones and how to add one. Registering a name twice with
different factories raises.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tracerl.envs.base import Env
from tracerl.errors import NotFoundError, UserError, unknown
from tracerl.imports import (
    PYTHON_OBJECT,
    describe,
    entry_points,
    is_import_path,
    load_entry_point,
    load_object,
    not_in_this_process,
    search_directory,
)

ENTRY_POINT_GROUP = "tracerl.envs"
HOW_TO_ADD = (
    "name one by import path (env.name: package.module:Class), declare an entry point in "
    f"group {ENTRY_POINT_GROUP!r}, or start one with `tracerl init NAME` "
    "(docs/your-own-env.md)"
)

_REGISTRY: dict[str, Callable[..., Env]] = {}
_AGENTS: dict[str, str] = {}


def register(name: str, factory: Callable[..., Env], *, agent: str | None = None) -> None:
    """Register `factory` under `name` (the same factory twice is a no-op: a module that
    registers its env on import may be imported again by a replay). `agent`: the agent
    (``package.module:function``) that plays this environment through the gateway when a
    run names none: an environment whose episodes are another framework's own."""
    if name in _REGISTRY and _REGISTRY[name] is not factory:
        raise ValueError(f"environment {name!r} is already registered")
    _REGISTRY[name] = factory
    if agent is not None:
        _AGENTS[name] = agent


def registered_factory(name: str) -> Callable[..., Env] | None:
    """The factory registered under `name` (`register`), if any."""
    return _REGISTRY.get(name)


def declared_agent(name: str) -> str | None:
    """The agent registered with environment `name` (`register`'s `agent`), if any."""
    return _AGENTS.get(name)


def registered() -> list[str]:
    """Names `make` accepts without an import path: registered and entry points."""
    return sorted({*_REGISTRY, *entry_points(ENTRY_POINT_GROUP)})


@dataclass(frozen=True)
class EnvSpec:
    """How to build an environment, resolved: its name, factory and where the factory
    lives (``module:qualname``, None for a factory that cannot be found by path)."""

    name: str
    factory: Callable[..., Env] = field(repr=False)
    import_path: str | None


def resolve(name: str) -> EnvSpec:
    """The environment `name` stands for; `NotFoundError` with the valid names if none."""
    if not isinstance(name, str) or not name:
        raise UserError(f"an environment name must be a non-empty string, got {name!r}")
    if name in _REGISTRY:
        factory = _REGISTRY[name]
        return EnvSpec(name, factory, describe(factory))
    if name.startswith(PYTHON_OBJECT):  # `tracerl.train(env=...)` registered it elsewhere
        raise not_in_this_process(
            "environment",
            name,
            "tracerl.train(CONFIG, env=YourEnv, resume=True)",
            "env.name: package.module:Class",
        )
    if is_import_path(name):
        factory = load_object(name, "environment")
        _check_factory(name, factory)
        return EnvSpec(name, factory, name)
    eps = entry_points(ENTRY_POINT_GROUP)
    if name in eps:
        factory = load_entry_point(eps[name], "environment")
        _check_factory(name, factory)
        return EnvSpec(name, factory, eps[name].value)
    raise unknown("environment", name, registered(), HOW_TO_ADD, listed="registered")


def _check_factory(name: str, factory: Any) -> None:
    if not callable(factory) or (inspect.isclass(factory) and not issubclass(factory, Env)):
        raise UserError(
            f"environment {name!r} is {repr(factory)[:60]}, not an environment class or factory",
            "point it at a subclass of tracerl.envs.Env (or ToolEnv), or a function returning one",
        )


def make(name: str, **kwargs: Any) -> Env:
    """A fresh environment instance (one per episode)."""
    spec = resolve(name)
    env = spec.factory(**kwargs)
    if not isinstance(env, Env):
        raise UserError(
            f"environment {name!r}: its factory returned {type(env).__name__}, not an Env",
            "return an instance of a tracerl.envs.Env subclass",
        )
    env.spec = {"name": name, "kwargs": dict(kwargs), "import": spec.import_path}  # type: ignore[attr-defined]
    return env


def make_with(
    name: str,
    kwargs: dict[str, Any],
    mcp: Sequence[Any] = (),
    cwd: str | None = None,
    real_writes: bool = False,
) -> Env:
    """`make(name, **kwargs)`, offering the tools of the MCP servers `mcp` too (a config's
    ``env.mcp``: `tracerl.envs.mcp.attach`), their relative commands run from `cwd`; with
    `real_writes`, every task may write for real when the guard is off."""
    env = make(name, **kwargs)
    if real_writes:
        env.allow_real_writes = True
        env.spec["allow_real_writes"] = True  # type: ignore[attr-defined]
    if mcp:
        from tracerl.envs.mcp import attach

        attach(env, list(mcp), cwd)
    return env


def make_from_spec(spec: dict[str, Any], **overrides: Any) -> Env:
    """Rebuild the environment a receipt's ``env`` describes (a live replay): by name, and
    when this process does not know the name (a user's env registered by a module nobody
    imported here), by the import path recorded with it; with the MCP servers it had."""
    name, kwargs = spec["name"], {**(spec.get("kwargs") or {}), **overrides}
    path, mcp = spec.get("import"), spec.get("mcp") or ()
    try:
        resolve(name)
    except NotFoundError:
        if not path:
            raise
        load_object(path, f"environment {name!r} from")  # its module may register the name
        if name not in _REGISTRY:
            env = make_with(path, kwargs, mcp)
            env.spec = {**env.spec, "name": name}  # type: ignore[attr-defined]
            return env
    return make_with(name, kwargs, mcp)


@dataclass(frozen=True)
class EnvFactory:
    """A picklable ``() -> Env`` (sent to Ray workers): it resolves the name where it runs,
    searching the driver's working directory too, so ``module:Class`` paths resolve there."""

    name: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    cwd: str | None = None
    mcp: tuple[dict[str, Any], ...] = ()
    """MCP servers whose tools the env offers too (`make_with`), as config dicts."""
    real_writes: bool = False
    """Every task may write for real when the guard is off (``env.allow_real_writes``)."""

    def __call__(self) -> Env:
        if self.cwd:
            search_directory(self.cwd)
        return make_with(self.name, self.kwargs, self.mcp, self.cwd, self.real_writes)


def env_factory(
    name: str,
    kwargs: dict[str, Any] | None = None,
    mcp: Sequence[Any] = (),
    *,
    real_writes: bool = False,
) -> EnvFactory:
    servers = tuple(s if isinstance(s, dict) else s.model_dump(mode="json") for s in mcp)
    return EnvFactory(name, dict(kwargs or {}), os.getcwd(), servers, real_writes)
