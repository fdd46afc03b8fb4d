"""The model's tool calls against the tools a harness offered (`tracerl.gateway`):
checked against their JSON schemas, and recorded, with what the harness answered, in the
episode runner's per-call form."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tracerl.envs.tools import ToolResult
from tracerl.types import Fault, FaultKind, ToolCall


def call_record(call: ToolCall, message: dict[str, Any], rec: dict[str, Any]) -> dict[str, Any]:
    """A tool call the model made and the harness answered, in the runner's record form."""
    bad = rec.get("fault_call") == call.id  # the call `check_calls` found at fault
    return {
        "call_id": call.id,
        "action": {"tool": call.name, "args": call.arguments},
        "tool_version": None,
        "effect": "unknown",
        "observation": {
            "status": "ok",
            "latency_ms": rec.get("latency_ms", 0.0),
            "truncated": False,
            "chars": len(message["content"]),
        },
        "env_status": {"service": "ok", "retryable": False},
        "policy_error": bad,
        "infra_error": False,
        "result": ToolResult(message["content"]).to_dict(),
    }


def check_calls(
    calls: Sequence[ToolCall], tools: list[dict[str, Any]] | None
) -> tuple[Fault, str] | None:
    """The model's calls against the request's tools: a tool not offered, or arguments its
    JSON schema refuses, is the policy's fault (the calls are still returned: the harness
    decides what to do with them). The first such fault and the call's id, or None."""
    offered = {t["function"]["name"]: t["function"] for t in tools or ()}
    for c in calls:
        fn = offered.get(c.name)
        if fn is None:
            names = ", ".join(sorted(offered)) or "none"
            return Fault(FaultKind.UNKNOWN_TOOL, f"unknown tool {c.name!r}; tools: {names}"), c.id
        problem = _schema_problem(c.arguments, fn.get("parameters"))
        if problem is not None:
            return Fault(FaultKind.INVALID_ARGUMENTS, f"{c.name}: {problem}"), c.id
    return None


def _schema_problem(arguments: dict[str, Any], schema: Any) -> str | None:
    if not isinstance(schema, dict):
        return None
    try:
        import jsonschema
    except ImportError:  # the required keys, at least
        missing = [k for k in schema.get("required", []) if k not in arguments]
        return f"missing required argument {missing[0]!r}" if missing else None
    try:
        jsonschema.validate(arguments, schema)
    except jsonschema.ValidationError as e:
        return e.message
    except jsonschema.SchemaError:
        return None  # the harness's schema is broken: not the model's fault
    return None
