"""A run config from what a Python caller gives (`tracerl.train`, `tracerl.Run.from_config`).

    config            a `RunConfig`, a dict of config keys, a YAML path, or None (defaults)
    sections          keyword sections merged into it: trainer={"steps": 3}, name="x",
                      env=..., model="tiny-chars" (short for model={"spec": ...})
    reward            short for trainer.reward (a list: trainer.reward_components)
    overrides         dotted keys as the command line takes them: ["trainer.steps=3"] or
                      {"trainer.steps": 3}

applied in that order (a later one wins). Every value becomes the dotted override it
flattens to, so a mistake reads exactly as `tracerl train`'s (``override 'trainer.stepz=3':
unknown key 'trainer.stepz'; did you mean 'trainer.steps'?``).

Objects stand where the config has names: ``env.name`` (an `Env` class or a factory),
``trainer.reward`` and a component's ``fn`` (a function or a callable object). One that an
import path finds again (``module:qualname``, not ``__main__``) is written as that path, so
``config.yaml`` and ``tracerl train CONFIG --resume`` mean the same run. Any other (defined
in a notebook, a script, a function) is registered for this process as ``python:<qualname>``
(``python:<qualname>#2`` for a second object of the same name) and ``config.yaml`` says so in
a comment; resumed elsewhere without it, the run stops with an error that says how to give it
again. Ray workers build environments in their own processes: a ``python:`` environment
with ``trainer.rollout.backend: ray`` is refused.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from tracerl.config import ConfigError, RunConfig
from tracerl.config.loading import load_config
from tracerl.envs.base import Env
from tracerl.envs.registry import register, registered_factory
from tracerl.errors import UserError
from tracerl.imports import PYTHON_OBJECT, describe, load_object, python_object_name
from tracerl.rewards.compose import ComponentSpec
from tracerl.rewards.resolve import register_reward, registered_reward

Config = RunConfig | Mapping[str, Any] | str | Path | None


def run_config(
    config: Config = None,
    *,
    reward: Any = None,
    overrides: list[str] | Mapping[str, Any] | None = None,
    **sections: Any,
) -> RunConfig:
    """The config `config`, `sections`, `reward` and `overrides` make (see the module's
    docstring); `ConfigError` for anything that does not validate, as the CLI words it."""
    path: Path | None = None
    layers: list[Mapping[str, Any]] = []
    if isinstance(config, RunConfig):
        layers.append(config.model_dump(mode="json"))
    elif isinstance(config, Mapping):
        layers.append(_shorthands(config))
    elif isinstance(config, str | Path):
        path = Path(config)
    elif config is not None:
        raise ConfigError(
            f"config: expected a RunConfig, a dict or a YAML path, got {type(config).__name__}",
            "e.g. tracerl.train('configs/demo.yaml') or tracerl.train({'env': {...}})",
        )
    layers.append(_sections(sections, reward))
    if isinstance(overrides, Mapping):
        layers.append(_nest(overrides))
    elif overrides is not None and not isinstance(overrides, list | tuple):
        raise ConfigError(
            f"overrides: expected a list of 'key.path=value' or a dict, got {overrides!r}",
            "e.g. overrides=['trainer.steps=3'] or overrides={'trainer.steps': 3}",
        )
    dotted = [item for layer in layers for item in _dotted(_with_names(layer))]
    if isinstance(overrides, list | tuple):
        dotted += [str(o) for o in overrides]
    cfg = load_config(path, dotted)
    if cfg.trainer.rollout.backend == "ray" and cfg.env.name.startswith(PYTHON_OBJECT):
        raise ConfigError(
            f"env.name {cfg.env.name!r} is an object of this process; Ray workers build "
            "environments in their own processes, which cannot find it",
            "define it in a module (a .py file, not __main__) so that tracerl names it by "
            "import path, or use trainer.rollout.backend=inprocess",
        )
    return cfg


def _shorthands(data: Mapping[str, Any]) -> dict[str, Any]:
    """``env=X`` short for ``env={"name": X}``, ``model="spec"`` for
    ``model={"spec": ...}``."""
    out = dict(data)
    if "env" in out and out["env"] is not None and not isinstance(out["env"], Mapping):
        out["env"] = {"name": out["env"]}
    if isinstance(out.get("model"), str):
        out["model"] = {"spec": out["model"]}
    return out


def _sections(sections: dict[str, Any], reward: Any) -> dict[str, Any]:
    """Keyword sections as config data (`_shorthands`), with `reward` as
    ``trainer.reward`` (a list: ``trainer.reward_components``; the other one cleared:
    `reward` is the run's reward)."""
    out = _shorthands(sections)
    if reward is not None:
        trainer = dict(out.get("trainer") or {})
        if "reward" in trainer or "reward_components" in trainer:
            raise ConfigError(
                "reward= and trainer={'reward' or 'reward_components': ...} are both given",
                "give the run's reward once",
            )
        if isinstance(reward, list | tuple):
            trainer.update(reward=None, reward_components=list(reward))
        else:
            trainer.update(reward=reward, reward_components=None)
        out["trainer"] = trainer
    return out


def _nest(dotted: Mapping[str, Any]) -> dict[str, Any]:
    """``{"trainer.steps": 3}`` as ``{"trainer": {"steps": 3}}``."""
    out: dict[str, Any] = {}
    for key, value in dotted.items():
        *parents, last = str(key).split(".")
        node = out
        for k in parents:
            node = node.setdefault(k, {})
            if not isinstance(node, dict):
                raise ConfigError(f"overrides: {key!r} goes inside a value, not a section")
        node[last] = value
    return out


def _with_names(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """`data` with its objects replaced by the names that find them (``env.name``,
    ``trainer.reward``, a component's ``fn``)."""
    env, trainer = data.get("env"), data.get("trainer")
    out = dict(data)
    if isinstance(env, Mapping) and _is_object(env.get("name")):
        out["env"] = {**env, "name": env_name(env["name"])}
    if isinstance(trainer, Mapping):
        trainer = dict(trainer)
        if _is_object(trainer.get("reward")):
            trainer["reward"] = reward_name(trainer["reward"])
        if isinstance(trainer.get("reward_components"), list | tuple):
            trainer["reward_components"] = [_component(c) for c in trainer["reward_components"]]
        out["trainer"] = trainer
    return out


def _is_object(value: Any) -> bool:
    return value is not None and not isinstance(value, str | int | float | bool | list | dict)


def _component(c: Any) -> Any:
    if isinstance(c, ComponentSpec):
        c = c.model_dump(mode="json")
    if isinstance(c, Mapping) and _is_object(c.get("fn")):
        return {**c, "fn": reward_name(c["fn"])}
    return c


def env_name(env: Any) -> str:
    """The ``env.name`` of an environment class or factory: its import path, or the
    ``python:`` name it is registered under for this process."""
    if isinstance(env, Env):
        raise UserError(
            f"env: got an instance of {type(env).__name__}; a run builds a fresh environment "
            "for every episode",
            f"pass the class ({type(env).__name__}) or a function that returns a new one",
        )
    if inspect.isclass(env) and not issubclass(env, Env):
        raise UserError(
            f"env: {env.__qualname__} is not an environment class",
            "pass a subclass of tracerl.envs.Env (or ToolEnv), or a function returning one",
        )
    if not callable(env):
        raise UserError(
            f"env: expected a name, an environment class or a factory, got {type(env).__name__}",
            "e.g. env='arithmetic', env=MyEnv or env=lambda: MyEnv(level=2)",
        )
    return _named(env, registered_factory, register)


def reward_name(reward: Any) -> str:
    """The ``trainer.reward`` (or component ``fn``) of a reward function or callable
    object: its import path, or the ``python:`` name it is registered under."""
    if inspect.isclass(reward) or not callable(reward):
        raise UserError(
            f"reward: expected a name, a function or a list of components, got "
            f"{'the class ' + reward.__qualname__ if inspect.isclass(reward) else repr(reward)}",
            "pass a function (named arguments or ctx -> number or Score), or an instance "
            "of a class with __call__",
        )
    return _named(reward, registered_reward, register_reward)


def _named(
    obj: Any, registered: Callable[[str], Any], register_as: Callable[[str, Any], None]
) -> str:
    path = describe(obj)
    if path is not None:
        try:
            if load_object(path, "object") is obj:
                return path
        except UserError:  # a module not importable by name (a file run as a script)
            pass
    base = python_object_name(obj)
    name, n = base, 1
    while (known := registered(name)) is not None and known is not obj:
        n += 1
        name = f"{base}#{n}"
    if known is None:
        register_as(name, obj)
    return name


def _dotted(data: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Config data as ``key.path=value`` overrides (values written as YAML, which reads them
    back as they were); a mapping is walked into unless it is empty or a key of it could
    not be a dotted path's part."""
    out: list[str] = []
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value and all(_part(k) for k in value):
            out += _dotted(value, path + ".")
        else:
            out.append(f"{path}={_yaml(path, value)}")
    return out


def _part(key: Any) -> bool:
    return isinstance(key, str) and bool(key) and not any(c in key for c in ".=")


def _yaml(path: str, value: Any) -> str:
    try:
        text = yaml.safe_dump(_plain(value), default_flow_style=True, width=1 << 30)
    except yaml.YAMLError:
        raise ConfigError(
            f"{path}: a {type(value).__name__} cannot go into a config",
            "give numbers, strings, lists and dicts; environment and reward objects go in "
            "env= (env.name) and reward= (trainer.reward)",
        ) from None
    return text.removesuffix("\n...\n").removesuffix("\n")


def _plain(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def python_objects_note(cfg: RunConfig) -> str:
    """Comment lines for the top of ``config.yaml``: which of its names are objects of the
    process that started the run, and how to resume it (empty when there are none)."""
    names = [("env.name", cfg.env.name, registered_factory(cfg.env.name), "env")]
    if cfg.trainer.reward:
        reward = cfg.trainer.reward
        names.append(("trainer.reward", reward, registered_reward(reward), "reward"))
    for c in cfg.trainer.reward_components or []:
        key = f"trainer.reward_components ({c.name})"
        names.append((key, c.fn, registered_reward(c.fn), "reward"))
    lines, keywords = [], []
    for key, name, obj, keyword in names:
        if not name.startswith(PYTHON_OBJECT):
            continue
        module = getattr(obj, "__module__", None) or "an unnamed module"
        lines.append(
            f"# {key}: {name} is a Python object (defined in {module}) given to "
            f"tracerl.train({keyword}=...), found in that process only."
        )
        keywords += [] if keyword in keywords else [keyword]
    if lines:
        again = "".join(f"{k}=..., " for k in keywords)
        lines.append(
            "# Resume the run from Python, giving them again: "
            f"tracerl.train(THIS_FILE, {again}resume=True)."
        )
    return "".join(line + "\n" for line in lines)
