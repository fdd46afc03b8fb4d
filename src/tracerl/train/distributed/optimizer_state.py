"""The optimizer's state in checkpoints: keyed by parameter name, for every strategy.

``optimizer.state_dict()`` keys parameters by their position in the optimizer; a sharded
learner's (``torch.distributed.checkpoint``'s full state) keys them by name. Checkpoints
hold the named form (`named_optimizer_state`), so one written by any strategy loads in any
other; older checkpoints' positional form still loads (`load_named_optimizer_state`).
``fsdp2`` trains the model inside a root module, whose names carry a ``model.`` prefix
(`with_prefix`, `without_prefix`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

ROOT_PREFIX = "model."


def rekeyed(state: dict[str, Any], key: Callable[[Any], Any]) -> dict[str, Any]:
    """`state` with every parameter key (in ``state`` and in each group's ``params``) mapped
    through `key`."""
    return {
        "state": {key(k): v for k, v in state.get("state", {}).items()},
        "param_groups": [
            {**g, "params": [key(p) for p in g["params"]]} for g in state.get("param_groups", [])
        ],
    }


def _by_position(state: dict[str, Any]) -> bool:
    return all(isinstance(i, int) for g in state.get("param_groups", []) for i in g["params"])


def _names_in_order(module: Any, optimizer: Any) -> list[str]:
    names = {id(p): n for n, p in module.named_parameters()}
    return [names[id(p)] for g in optimizer.param_groups for p in g["params"]]


def named_optimizer_state(module: Any, optimizer: Any) -> dict[str, Any]:
    """``optimizer.state_dict()`` keyed by `module`'s parameter names."""
    return rekeyed(optimizer.state_dict(), _names_in_order(module, optimizer).__getitem__)


def load_named_optimizer_state(module: Any, optimizer: Any, state: dict[str, Any]) -> None:
    """Load `named_optimizer_state`'s form (or an older checkpoint's positional one)."""
    if _by_position(state):
        optimizer.load_state_dict(state)
        return
    order = _names_in_order(module, optimizer)
    wanted = [n for g in state.get("param_groups", []) for n in g["params"]]
    if sorted(wanted) != sorted(order):
        unknown = sorted(set(wanted) - set(order))[:3]
        missing = sorted(set(order) - set(wanted))[:3]
        raise ValueError(
            "checkpoint's optimizer state does not match the model's trainable parameters "
            f"(unknown: {unknown}, missing: {missing}); was it written for another model "
            "or another LoRA setting?"
        )
    optimizer.load_state_dict(rekeyed(state, {n: i for i, n in enumerate(order)}.__getitem__))


def with_prefix(module: Any, state: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's optimizer state keyed by the root's names (`module`: the model, whose
    trainable parameters' order gives an older checkpoint's positions their names)."""
    if _by_position(state):
        order = [n for n, p in module.named_parameters() if p.requires_grad]
        state = rekeyed(state, order.__getitem__)
    return rekeyed(state, lambda n: ROOT_PREFIX + n)


def without_prefix(state: dict[str, Any]) -> dict[str, Any]:
    """The root's optimizer state keyed by the model's own names."""
    return rekeyed(state, lambda n: n.removeprefix(ROOT_PREFIX))
