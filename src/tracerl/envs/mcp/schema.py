"""What a server's listing says about a tool, read the way tracerl needs it: its effect from
the annotations in force (the config's, by name or pattern, over the server's, over the MCP
spec's defaults), its dry-run path checked, its input schema checked and applied, its name as
the model sees it, and a result as the observation's text."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from tracerl.envs.mcp.config import McpServer, ToolHints, dry_run_mode, matching


def unannotated_warning(server: McpServer, n: int) -> str:
    return (
        f"{server.where()} declares no annotations on any of its {n} tools: every tool is "
        "treated as a write (budgeted, dry-run; the agent cannot read anything). Say which "
        'only read, by name or pattern: annotations: {"get_*": {readOnlyHint: true}}'
    )


def effective_hints(server: Any, override: ToolHints | None) -> dict[str, Any]:
    """The annotations in force: the config's, else the server's, else the spec's defaults
    (a tool that says nothing may write, destroy, not be retried, reach the world)."""
    defaults = {
        "readOnlyHint": False,
        "destructiveHint": True,
        "idempotentHint": False,
        "openWorldHint": True,
    }
    attrs = {
        "readOnlyHint": "read_only_hint",
        "destructiveHint": "destructive_hint",
        "idempotentHint": "idempotent_hint",
        "openWorldHint": "open_world_hint",
    }
    out = {}
    for key, attr in attrs.items():
        mine = getattr(override, attr, None) if override is not None else None
        theirs = getattr(server, attr, None) if server is not None else None
        out[key] = mine if mine is not None else theirs if theirs is not None else defaults[key]
    if out["readOnlyHint"]:
        out["destructiveHint"] = False  # meaningful only for a tool that writes
    return out


def check_dry_run(s: McpServer, t: Any, how: str, offered: dict[str, Any]) -> None:
    """A declared dry-run path must exist on the server as declared."""
    mode, arg = dry_run_mode(how, where=f"{s.where()}: dry_run.{t.name}")
    if mode == "tool" and arg not in offered:
        raise ValueError(
            f"{s.where()}: dry_run.{t.name} is 'tool:{arg}', but the server has no tool "
            f"{arg!r} (its tools: {sorted(offered)})"
        )
    preview = offered.get(arg)
    if (
        mode == "tool"
        and not effective_hints(preview.annotations, matching(arg, s.annotations))["readOnlyHint"]
    ):
        raise ValueError(
            f"{s.where()}: dry_run.{t.name} is 'tool:{arg}', but {arg!r} is not annotated "
            "read-only: a preview must not change anything (annotate it, or override "
            f"annotations.{arg}.readOnlyHint if the server is wrong)"
        )
    if mode == "argument":
        prop = ((t.input_schema or {}).get("properties") or {}).get(arg)
        if not isinstance(prop, dict) or prop.get("type") != "boolean":
            raise ValueError(
                f"{s.where()}: dry_run.{t.name} is 'argument:{arg}', but the tool's schema "
                f"declares no boolean argument {arg!r}"
            )


def model_name(prefix: str, remote: str) -> str:
    """The name the model sees: the prefix and the server's name, with characters tracerl's
    tool names do not allow (MCP allows ``-`` and ``.``) as ``_``, at most 64."""
    return re.sub(r"[^A-Za-z0-9_]", "_", prefix + remote)[:64]


def check_schema(s: McpServer, name: str, schema: dict[str, Any]) -> None:
    """The tool's input schema is JSON Schema the validator can apply, or the server entry
    is refused naming the tool."""
    import jsonschema

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as e:
        raise ValueError(
            f"{s.where()}: tool {name!r} has an input schema that is not valid JSON Schema "
            f"({e.message}); leave it out with `tools`"
        ) from None


def without(schema: dict[str, Any], name: str) -> dict[str, Any]:
    """`schema` without the property `name` (a dry-run flag the model must not set)."""
    props = {k: v for k, v in (schema.get("properties") or {}).items() if k != name}
    out = {**schema, "properties": props}
    if "required" in schema:
        out["required"] = [r for r in schema["required"] if r != name]
    return out


def schema_hash(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def schema_problems(schema: dict[str, Any], arguments: dict[str, Any]) -> str | None:
    """What the tool's JSON schema says is wrong with `arguments` (None: nothing)."""
    import jsonschema

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    errors = sorted(cls(schema).iter_errors(arguments), key=lambda e: list(e.absolute_path))
    if not errors:
        return None
    return "; ".join(
        f"{'.'.join(str(p) for p in e.absolute_path) or 'arguments'}: {e.message}"
        for e in errors[:3]
    )


def result_text(result: Any, limit: int) -> tuple[str, bool]:
    """A tool result as the observation's text (and whether it was cut at `limit`):
    text parts as they are, other content named, structured content as JSON when that is
    all there is."""
    parts = []
    for c in result.content or ():
        kind = getattr(c, "type", None)
        if kind == "text":
            parts.append(c.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind}: {c.mime_type}, {len(c.data) * 3 // 4} bytes]")
        elif kind == "resource_link":
            parts.append(f"[resource: {c.uri}]")
        elif kind == "resource":
            res = c.resource
            text = getattr(res, "text", None)
            parts.append(text if text is not None else f"[resource: {res.uri}]")
        else:
            parts.append(f"[{kind} content]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False, sort_keys=True))
    text = "\n".join(parts)
    if len(text) <= limit:
        return text, False
    marker = f"\n[... MCP result truncated: showing {limit} of {len(text)} characters ...]"
    return text[:limit] + marker, True
