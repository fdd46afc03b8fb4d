"""The run's reward, found: the environment's own verifier, a built-in, or the user's code.

    trainer.reward: null                     the environment's own (`reward_components`, or
                                             its ``reward``/``score`` method)
    trainer.reward: search                   a built-in: search, arithmetic, coderepair
    trainer.reward: mypkg.rewards:unit       an import path: a function (the outcome), or a
                                             layered spec (YAML text, a list of components)
    trainer.reward: unit                     an entry point of group ``tracerl.rewards``
    trainer.reward_components: [...]         a layered spec in the config itself
    trainer.reward: python:my_reward         a Python object `tracerl.train(reward=...)`
                                             registered for its process (`register_reward`)

Whatever is named goes through the composer (`tracerl.rewards.compose`): gates, caps and an
attribution label apply to a user's function as to the built-ins, and every episode's
breakdown names the components that scored it. An environment with no reward of its own and
none configured is a configuration error, never a borrowed reward.

A user's function is called with what its parameters ask for, by name (as `verifiers` and
TRL pass dataset columns): ``ctx`` (the `RewardContext`), ``task``, ``completion`` (the final
answer's text), ``final_answer`` (its dict), ``steps``, ``stop_reason``, ``info`` (the last
step's), ``trajectories``, ``ledger``, ``step`` (the step a ``per: step`` component is
scoring), the component's ``params``, and any field of the task (``answer``, ``target``...).
It returns a number (1.0 or more is a success), a `Score`, a ``(value, evidence)`` pair, or
None when it cannot decide (the episode then waits for a person and never trains on a
guess). Raising is the evaluator's fault, never the policy's.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any

import yaml
from pydantic import ValidationError

from tracerl.errors import NotFoundError, UserError, unknown
from tracerl.imports import (
    PYTHON_OBJECT,
    entry_points,
    is_import_path,
    load_entry_point,
    load_object,
    not_in_this_process,
)
from tracerl.rewards.compose import (
    COMPONENTS,
    ComponentFn,
    ComponentSpec,
    RewardContext,
    RewardSpec,
    Score,
    per_step_problem,
)
from tracerl.rewards.run_reward import RunReward

ENTRY_POINT_GROUP = "tracerl.rewards"
HOW_TO_ADD = (
    "give the environment a reward(self, ctx) method or reward_components, or set "
    "trainer.reward: package.module:function (docs/your-own-env.md)"
)
PASSED = (
    "ctx",
    "task",
    "completion",
    "final_answer",
    "steps",
    "stop_reason",
    "info",
    "trajectories",
    "ledger",
    "step",
)
"""What a user's reward function may ask for by name (besides the task's fields); ``step``
is the step being scored by a ``per: step`` component (None for ``per: episode``)."""
ATTRIBUTION = {"name": "attribution", "fn": "attribution_label", "layer": "attribution"}
OWN_METHODS = ("reward", "score")

_OBJECTS: dict[str, Any] = {}
"""Rewards given as Python objects, by their ``python:`` name (`register_reward`)."""
NOT_HERE = ("tracerl.train(CONFIG, reward=your_function, resume=True)", "package.module:function")


def register_reward(name: str, reward: Any) -> None:
    """Register `reward` (a function, a callable object, or a layered spec) under `name`
    for this process: what ``trainer.reward`` and a component's ``fn`` may then name. The
    same object twice is a no-op; another object under a registered name raises."""
    if name in _OBJECTS and _OBJECTS[name] is not reward:
        raise ValueError(f"reward {name!r} is already registered")
    _OBJECTS[name] = reward


def registered_reward(name: str) -> Any:
    """The object registered under `name` (`register_reward`), or None."""
    return _OBJECTS.get(name)


def builtin_rewards() -> dict[str, str]:
    """The built-in rewards of this layer by name: their layered specs (YAML).

    The built-in ``arithmetic`` and ``coderepair`` rewards live with their environments
    (their specs name components those modules register), and rewards/ sits below envs/:
    importing them here would be an upward import. tracerl's own pyproject.toml declares
    them as entry points of group ``tracerl.rewards`` instead, so they are found the way an
    installed package's rewards are (`_named`, `known_rewards`), loading their module (and
    registering its components) only when named. An entry point needs no import order (a
    registry the envs filled in would be empty until something imported them) and no
    import path hidden in a string here; it needs tracerl installed, which `make install`
    does (again whenever pyproject.toml changes)."""
    from tracerl.rewards.components import SEARCH_REWARD

    return {"search": SEARCH_REWARD}


def known_rewards() -> list[str]:
    return sorted({*builtin_rewards(), *entry_points(ENTRY_POINT_GROUP)})


def env_has_reward(env: Any) -> bool:
    return bool(getattr(env, "reward_components", None)) or _own_method(env) is not None


def _own_method(env: Any) -> Callable[..., Any] | None:
    for name in OWN_METHODS:
        method = getattr(env, name, None)
        if callable(method) and inspect.ismethod(method):
            return method
    return None


def resolve_reward(
    reward: str | None,
    components: list[ComponentSpec] | list[dict[str, Any]] | None,
    env: Any,
    *,
    env_name: str = "",
) -> RunReward:
    """The run's reward (see the module's docstring); `env` is an instance of the run's
    environment (its methods may be components; its ``document`` checks citations)."""
    lookup = getattr(env, "document", None) or (lambda _: None)
    label = getattr(env, "name", "") or type(env).__name__  # its own component's name
    said = env_name or label  # what the config called it, in errors
    if components and reward:
        raise UserError(
            "trainer.reward and trainer.reward_components are both set",
            "keep one: a named reward, or the components of one",
        )
    own, method = getattr(env, "reward_components", None), _own_method(env)
    if components:
        where = source = "trainer.reward_components"
        spec = _spec(components, where)
    elif reward:
        where = source = f"trainer.reward: {reward}"
        spec = _spec(_named(reward), where)
    elif own:
        where, source = f"environment {label!r}: reward_components", f"{label}'s own"
        spec = _spec(own, where)
    elif method is not None:
        where, source = label, f"{label}'s own"
        spec = _spec(
            [ATTRIBUTION, {"name": label, "fn": method.__name__, "layer": "outcome"}], where
        )
    else:
        raise UserError(
            f"environment {said!r} has no reward of its own and trainer.reward is not set",
            HOW_TO_ADD,
        )
    return RunReward(spec, _functions(spec, env, where), source, lookup)


def _named(name: str) -> Any:
    """What ``trainer.reward`` names, as a spec's source: a built-in's YAML, a user's spec
    (YAML text, a list of components, a `RewardSpec`), or one outcome component around a
    user's function (its `fn` the import path `_functions` resolves)."""
    builtin = builtin_rewards()
    if name in builtin:
        return builtin[name]
    if name in _OBJECTS:
        obj, path = _OBJECTS[name], name
    elif name.startswith(PYTHON_OBJECT):
        raise not_in_this_process("trainer.reward", name, *NOT_HERE)
    elif is_import_path(name):
        obj, path = load_object(name, "reward"), name
    else:
        eps = entry_points(ENTRY_POINT_GROUP)
        if name not in eps:
            raise unknown(
                "reward",
                name,
                known_rewards(),
                "name a function by import path (trainer.reward: package.module:function), "
                f"declare an entry point in group {ENTRY_POINT_GROUP!r}, or leave it unset to "
                "use the environment's own",
                listed="built-in and installed",
            )
        obj, path = load_entry_point(eps[name], "reward"), eps[name].value
    if isinstance(obj, RewardSpec | str | list):
        return obj
    if callable(obj):
        title = getattr(obj, "__name__", "reward")
        return [ATTRIBUTION, {"name": title, "fn": path, "layer": "outcome"}]
    raise UserError(
        f"{name}: that is a {type(obj).__name__}, not a reward",
        "point it at a function (ctx or named arguments -> number or Score), or at a "
        "layered spec (YAML text or a list of components)",
    )


def _spec(source: Any, where: str) -> RewardSpec:
    if isinstance(source, RewardSpec):
        return source
    try:
        data = yaml.safe_load(source) if isinstance(source, str) else source
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" (line {mark.line + 1} of the text)" if mark is not None else ""
        raise UserError(
            f"{where}: invalid YAML{at}: {getattr(e, 'problem', None) or e}",
            "write the components as YAML text or a list of dicts",
        ) from None
    if isinstance(data, list):
        data = {"components": data}
    try:
        return RewardSpec.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise UserError(
            f"{where}: {loc}: {err['msg']} (got {err.get('input')!r})",
            "each component needs name, fn and layer (outcome, constraint, process, cost, "
            "attribution); optional weight, gate, cap, params, per (episode or step)",
        ) from None


def _functions(spec: RewardSpec, env: Any, where: str) -> dict[str, ComponentFn]:
    """Each component's function: a registered component, a method of the env, a Python
    object registered for this process, an import path or an entry point, in that order."""
    out: dict[str, ComponentFn] = {}
    for c in spec.components:
        if c.fn in out and c.fn not in COMPONENTS:
            continue
        if c.fn in COMPONENTS and (validate := getattr(COMPONENTS[c.fn], "validate", None)):
            try:  # what it needs is checked now (a judge's rubric, endpoint, key), not later
                validate(c.params, f"{where}: component {c.name!r}")
            except (ValueError, TypeError) as e:
                raise UserError(
                    f"{where}: component {c.name!r}: {e}",
                    "fix the component's params (docs/judges.md for a judge's)",
                ) from None
        method = getattr(env, c.fn, None) if c.fn.isidentifier() else None
        if callable(method) and inspect.ismethod(method) and c.fn not in COMPONENTS:
            out[c.fn] = adapt(method, f"{type(env).__name__}.{c.fn}")
        elif c.fn in COMPONENTS:
            if (problem := per_step_problem(c)) is not None:
                raise UserError(f"{where}: {problem}", "declare it per: episode")
            out[c.fn] = COMPONENTS[c.fn]
        elif c.fn in _OBJECTS:
            out[c.fn] = adapt(_OBJECTS[c.fn], c.fn)
        elif c.fn.startswith(PYTHON_OBJECT):
            raise not_in_this_process(f"{where}: component {c.name!r}: function", c.fn, *NOT_HERE)
        elif is_import_path(c.fn):
            out[c.fn] = adapt(load_object(c.fn, f"{where}: component {c.name!r}"), c.fn)
        elif (ep := entry_points(ENTRY_POINT_GROUP).get(c.fn)) is not None:
            out[c.fn] = adapt(load_entry_point(ep, "reward component"), ep.value)
        else:
            raise NotFoundError(
                f"{where}: component {c.name!r}: unknown function {c.fn!r}; registered: "
                f"{', '.join(sorted(COMPONENTS))}",
                "name a method of the environment, a registered component, or a function by "
                "import path (package.module:function)",
            )
    return out


def adapt(fn: Callable[..., Any], path: str) -> ComponentFn:
    """A user's function as a component ``fn(ctx, **params) -> Score``: its arguments filled
    by name, its return value read as a score (see the module's docstring)."""
    if inspect.isclass(fn) or not callable(fn):
        what = "a class" if inspect.isclass(fn) else f"a {type(fn).__name__}"
        raise UserError(
            f"reward {path!r} is {what}, not a function",
            "point it at a function (ctx or named arguments -> number or Score)",
        )
    if inspect.iscoroutinefunction(fn):
        raise UserError(
            f"reward {path!r} is an async function; rewards are called synchronously",
            "make it a plain def (do slow checks in the environment, or cache them)",
        )
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    kinds = inspect.Parameter
    var_kw = any(p.kind is kinds.VAR_KEYWORD for p in params)
    named = [p for p in params if p.kind not in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD)]
    first = named[0] if named else None
    takes_ctx = first is not None and (
        first.name == "ctx" or "RewardContext" in str(first.annotation)
    )

    def component(ctx: RewardContext, **extra: Any) -> Score:
        if takes_ctx and first is not None and first.name != "ctx":
            args: dict[str, Any] = {first.name: ctx}
        else:
            args = {}
        available = {**ctx.task, **_passed(ctx), **extra}
        for p in named:
            if p.name in args:
                continue
            if p.name in available:
                args[p.name] = available[p.name]
            elif p.default is kinds.empty:
                raise TypeError(
                    f"{path}: cannot pass parameter {p.name!r}: tracerl passes "
                    f"{', '.join(PASSED)}, the component's params and the task's fields "
                    f"({', '.join(ctx.task)})"
                )
        if var_kw:
            args.update({k: v for k, v in available.items() if k not in args})
        return as_score(fn(**args), path)

    def check(task: dict[str, Any], params: dict[str, Any]) -> str | None:
        """Why this function cannot be called for `task` with `params` (None: it can)."""
        available = {*PASSED, *task, *params}
        missing = [
            p.name
            for p in named[1 if takes_ctx else 0 :]
            if p.default is kinds.empty and p.name not in available
        ]
        if missing:
            return (
                f"{path}: cannot pass parameter(s) {', '.join(map(repr, missing))}: tracerl "
                f"passes {', '.join(PASSED)}, the component's params and the task's fields "
                f"({', '.join(task) or 'none'})"
            )
        unknown_params = [k for k in params if not var_kw and k not in {p.name for p in named}]
        if unknown_params:
            return f"{path}: takes no parameter(s) {', '.join(map(repr, unknown_params))}"
        return None

    component.__name__ = getattr(fn, "__name__", "component")
    component.check = check  # type: ignore[attr-defined]
    return component


def check_functions(reward: RunReward, task: dict[str, Any]) -> str | None:
    """Why a component of `reward` cannot be called on `task` (None: each can): a user's
    function that asks for what tracerl cannot pass, or params a function does not take."""
    for c in reward.spec.components:
        fn = reward.functions[c.fn]
        check = getattr(fn, "check", None)
        if check is not None:
            problem = check(task, c.params)
        else:  # a registered component: fn(ctx, **params)
            params = inspect.signature(fn).parameters
            takes = {n for n in list(params)[1:]}
            var_kw = any(p.kind is p.VAR_KEYWORD for p in params.values())
            bad = [k for k in c.params if k not in takes and not var_kw]
            problem = f"{c.fn} takes no parameter(s) {', '.join(map(repr, bad))}" if bad else None
        if problem:
            return f"component {c.name!r}: {problem}"
    return None


def _passed(ctx: RewardContext) -> dict[str, Any]:
    return {
        "ctx": ctx,
        "task": ctx.task,
        "completion": ctx.answer_text,
        "final_answer": ctx.answer,
        "steps": ctx.steps,
        "stop_reason": ctx.stop_reason,
        "info": ctx.info,
        "trajectories": ctx.trajectories,
        "ledger": ctx.ledger,
        "step": ctx.step,
    }


def as_score(value: Any, path: str) -> Score:
    """What a user's function returned, as a `Score`."""
    if isinstance(value, Score):
        return value
    if value is None:
        return Score(0.0, {"verdict": "the verifier could not decide"}, decided=False)
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], dict):
        return Score(_number(value[0], path), dict(value[1]))
    if isinstance(value, dict) and "value" in value:
        rest = {k: v for k, v in value.items() if k not in ("value", "decided")}
        return Score(_number(value["value"], path), rest, bool(value.get("decided", True)))
    return Score(_number(value, path))


def _number(value: Any, path: str) -> float:
    if isinstance(value, bool | int | float) and math.isfinite(float(value)):
        return float(value)
    raise TypeError(
        f"{path} returned {value!r} ({type(value).__name__}); return a number, a Score, "
        "a (value, evidence) pair, or None when it cannot decide"
    )
