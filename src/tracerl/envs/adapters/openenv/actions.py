"""How a reply becomes an OpenEnv action, and whose a refused action is.

The reply fills one text field of the environment's action (``action: <field>``), or is the
action itself, a JSON object (``action: json``, a fenced block too). The action's JSON schema
is what the server publishes at ``/schema`` (its action class's pydantic schema).

openenv-core's server answers VALIDATION_ERROR both when the action does not fit the action
class and when the environment's step built an observation its own class refuses (0.3.0:
one handler wraps reading the action, ``step`` and serializing the observation), so the
answer alone names no owner. `action_problems` decides: an action that does not fit the
action's schema is the policy's; one that fits it was refused for something the schema does
not state (the step's own bug, or a validator in code), which is the environment's.
"""

from __future__ import annotations

import json
import re
from typing import Any

from tracerl.errors import UserError

_FENCE = re.compile(r"^```[\w-]*\n(.*?)\n?```$", re.DOTALL)
JSON = "json"
"""The `action` mode in which the reply is the action."""


def action_field(mode: str | None, schema: dict[str, Any]) -> str:
    """The action field the reply fills, or ``json`` (the reply is the action)."""
    action = action_schema(schema)
    props = action.get("properties") or {}
    if mode == JSON:
        return mode
    if mode is not None:
        if props and mode not in props:
            raise UserError(
                f"action: the environment's action ({action.get('title')}) has no field {mode!r}; "
                f"its fields: {', '.join(sorted(props))}",
                "name the text field the reply fills, or action: json (the reply is the action)",
            )
        return mode
    required = [r for r in action.get("required") or () if r != "metadata"]
    if len(required) == 1 and (props.get(required[0]) or {}).get("type") == "string":
        return required[0]
    return JSON


def to_action(reply: str, field: str) -> dict[str, Any]:
    """The action `reply` stands for; ValueError when it stands for none."""
    if field != JSON:
        return {field: reply}
    text = reply.strip()
    fenced = _FENCE.match(text)
    try:
        action = json.loads(fenced.group(1) if fenced else text)
    except ValueError as e:
        raise ValueError(f"the reply is not a JSON action ({e})") from None
    if not isinstance(action, dict):
        raise ValueError(f"the reply is JSON but not an object: {text:.80}")
    return action


def action_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The action's JSON schema in the server's ``/schema`` answer ({} if it has none)."""
    action = schema.get("action")
    return action if isinstance(action, dict) else {}


def check_action_schema(schema: dict[str, Any]) -> None:
    """The action's schema is JSON Schema the validator can apply (`action_problems` needs
    it), or a UserError saying so."""
    validator = _validator(action_schema(schema))
    try:
        validator.check_schema(validator.schema)
    except Exception as e:  # jsonschema.SchemaError
        raise UserError(
            f"openenv: the server's action schema (/schema) is not valid JSON Schema ({e})",
            "an OpenEnv server publishes its action class's pydantic schema there",
        ) from None


def action_problems(schema: dict[str, Any], action: dict[str, Any]) -> str | None:
    """What the action's JSON schema says is wrong with `action` (None: it fits)."""
    validator = _validator(action_schema(schema))
    errors = sorted(validator.iter_errors(action), key=lambda e: list(e.absolute_path))
    if not errors:
        return None
    return "; ".join(
        f"{'.'.join(str(p) for p in e.absolute_path) or 'action'}: {e.message}" for e in errors[:3]
    )


def _validator(action: dict[str, Any]) -> Any:
    try:
        import jsonschema
    except ImportError as e:
        raise UserError(
            "openenv: tells a refused action from a broken step with jsonschema, which is "
            "not installed",
            "pip install 'tracerl[openenv]'",
        ) from e
    cls = jsonschema.validators.validator_for(action, default=jsonschema.Draft202012Validator)
    return cls(action)
