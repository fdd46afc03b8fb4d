"""Tools from typed Python callables.

    @tool(effect="read", timeout_s=5.0, version="1")
    def lookup_order(order_id: str) -> str:
        '''Look up an order.

        Args:
            order_id: the order's id, e.g. "A1001".
        '''

The JSON schema the model sees is built from the signature and the docstring's ``Args:``
section; arguments are validated against it (pydantic, unknown keys refused) before the call.
A write tool (``effect="write"``) takes a ``dry_run: bool`` parameter, hidden from the schema:
with ``dry_run=True`` it must not change real state and returns the intended effect instead.

Calling a `Tool` never raises: timeouts, exceptions and bad arguments come back as a
`ToolResult` carrying a classified `Fault` (see `tracerl.types.FaultKind`). Inside a tool,
raise `PolicyError` for a call the model should not have made (forbidden by the task's rules)
and `InfraError` for a failing service; any other exception is an `unknown` fault.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import time
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import pydantic

from tracerl.types import Fault, FaultKind

Effect = Literal["read", "write"]
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


class PolicyError(Exception):
    """Raised by a tool when the call itself is the model's mistake (a forbidden action)."""

    def __init__(self, message: str, kind: FaultKind = FaultKind.FORBIDDEN_TOOL) -> None:
        super().__init__(message)
        self.kind = FaultKind(kind)


class InfraError(Exception):
    """Raised by a tool when a service it depends on failed (5xx, refused, sandbox)."""

    def __init__(
        self, message: str, kind: FaultKind = FaultKind.SERVER_ERROR, retryable: bool | None = None
    ) -> None:
        super().__init__(message)
        self.kind = FaultKind(kind)
        self.retryable = retryable


@dataclass
class ToolResult:
    """What a tool call produced. `error` is set when it failed; `content` is then what the
    model is shown about the failure.

    Attributes:
        content: the observation text for the model.
        error: the classified failure, or None.
        latency_ms: wall time of the call.
        evidence: optional facts for the budget ledger; ``evidence["gain"]`` (0..1) is how much
            this call moved the agent toward an answer, as the environment judges it.
        effect: for write tools, the side effect: intended (dry run) or applied.
        dry_run: True when a write tool ran as a dry run.
        truncated: True when `content` was cut to the observation token budget.
        is_error: the tool answered with an error as its result (MCP's ``isError``): an
            ordinary observation for the model, not a fault.
    """

    content: str
    error: Fault | None = None
    latency_ms: float = 0.0
    evidence: dict[str, Any] | None = None
    effect: dict[str, Any] | None = None
    dry_run: bool = False
    truncated: bool = False
    is_error: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def evidence_gain(self) -> float | None:
        gain = (self.evidence or {}).get("gain")
        return None if gain is None else float(gain)

    @classmethod
    def failure(cls, fault: Fault, latency_ms: float = 0.0) -> ToolResult:
        return cls(
            content=f"error ({fault.kind.value}): {fault.message}",
            error=fault,
            latency_ms=latency_ms,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "content": self.content,
            "error": self.error.to_dict() if self.error else None,
            "latency_ms": round(self.latency_ms, 3),
            "evidence": self.evidence,
            "effect": self.effect,
            "dry_run": self.dry_run,
            "truncated": self.truncated,
            **({"is_error": True} if self.is_error else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ToolResult:
        err = d.get("error")
        return cls(**{**d, "error": Fault.from_dict(err) if err else None})


@dataclass(frozen=True)
class Tool:
    """A callable the model can invoke by name. Build with `@tool`."""

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any]
    effect: Effect = "read"
    timeout_s: float = 10.0
    version: str = "1"
    has_dry_run: bool = False
    _args_model: type[pydantic.BaseModel] | None = field(default=None, repr=False)
    _owner: Any = field(default=None, repr=False, compare=False)

    def __get__(self, obj: Any, objtype: Any = None) -> Tool:
        """Used as a method decorator, the tool binds to its environment instance."""
        return self if obj is None else replace(self, _owner=obj)

    def receipt_schema(self) -> dict[str, Any]:
        """The schema as receipts keep it: with its effect (``x-effect``), which replay
        needs to account for the call as the run did."""
        return {**self.schema(), "x-effect": self.effect}

    def schema(self) -> dict[str, Any]:
        """The OpenAI-style function schema the chat template renders."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    def validate(self, arguments: Any) -> dict[str, Any] | Fault:
        """Validated (and coerced) arguments, or an `invalid_arguments` fault for the model."""
        if not isinstance(arguments, dict):
            return Fault(FaultKind.INVALID_ARGUMENTS, f"{self.name}: arguments must be an object")
        assert self._args_model is not None
        try:
            parsed = self._args_model.model_validate(arguments)
        except pydantic.ValidationError as e:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'arguments'}: {err['msg']}"
                for err in e.errors()
            )
            return Fault(FaultKind.INVALID_ARGUMENTS, f"{self.name}: {problems}")
        return dict(parsed)

    async def __call__(self, arguments: Any, *, dry_run: bool = False) -> ToolResult:
        """Validate, call with the timeout, classify any failure. Never raises."""
        t0 = time.perf_counter()
        args = self.validate(arguments)
        if isinstance(args, Fault):
            return ToolResult.failure(args)
        if self.effect == "write" and self.has_dry_run:
            args["dry_run"] = dry_run
        elif self.effect == "write" and dry_run:
            reason = f"{self.name} has no dry-run path and this task allows no real writes"
            return ToolResult.failure(Fault(FaultKind.FORBIDDEN_TOOL, reason))
        fn = self.fn if self._owner is None else self.fn.__get__(self._owner)
        try:
            if inspect.iscoroutinefunction(self.fn):
                out = await asyncio.wait_for(fn(**args), self.timeout_s)
            else:
                out = await asyncio.wait_for(asyncio.to_thread(fn, **args), self.timeout_s)
        except Exception as e:  # a tool never raises into the runner
            return ToolResult.failure(_classify(e, self), (time.perf_counter() - t0) * 1000)
        result = out if isinstance(out, ToolResult) else ToolResult(content=_as_text(out))
        result.latency_ms = (time.perf_counter() - t0) * 1000
        result.dry_run = self.effect == "write" and self.has_dry_run and dry_run
        return result


def _classify(e: BaseException, t: Tool) -> Fault:
    kind_of = type(e).__name__
    if isinstance(e, PolicyError):
        return Fault(e.kind, str(e), exception_type=kind_of)
    if isinstance(e, InfraError):
        return Fault(e.kind, str(e), retryable=e.retryable, exception_type=kind_of)
    if isinstance(e, TimeoutError):
        return Fault(
            FaultKind.TIMEOUT, f"{t.name} timed out after {t.timeout_s:g} s", None, kind_of
        )
    if isinstance(e, ConnectionRefusedError):
        return Fault(
            FaultKind.CONNECTION_REFUSED, f"{t.name}: connection refused ({e})", None, kind_of
        )
    return Fault(FaultKind.UNKNOWN, f"{t.name} raised {kind_of}: {e}", False, kind_of)


def _as_text(out: Any) -> str:
    if isinstance(out, str):
        return out
    if isinstance(out, dict | list):
        return json.dumps(out, ensure_ascii=False, sort_keys=True)
    return str(out)


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    effect: Effect = "read",
    timeout_s: float = 10.0,
    version: str = "1",
) -> Any:
    """Decorator: turn a typed function (or method) into a `Tool`."""

    def build(f: Callable[..., Any]) -> Tool:
        return make_tool(f, name=name, effect=effect, timeout_s=timeout_s, version=version)

    return build(fn) if fn is not None else build


def make_tool(
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    effect: Effect = "read",
    timeout_s: float = 10.0,
    version: str = "1",
) -> Tool:
    tool_name = name or fn.__name__
    where = f"tool {tool_name!r} ({fn.__module__}.{fn.__qualname__})"
    if not _NAME.match(tool_name):
        raise ValueError(f"{where}: a tool name is letters, digits and _ (at most 64)")
    if effect not in ("read", "write"):
        raise ValueError(f"{where}: effect must be 'read' or 'write', got {effect!r}")
    if not version:
        raise ValueError(f"{where}: give the tool a version, e.g. version='1'")
    summary, arg_docs = _parse_docstring(inspect.getdoc(fn) or "")
    if not summary:
        raise ValueError(f"{where}: needs a docstring; its first paragraph is the description")
    try:
        hints = typing.get_type_hints(fn)
    except NameError as e:
        raise ValueError(
            f"{where}: cannot resolve a type annotation ({e}); define or import the type at "
            "module level"
        ) from None
    fields: dict[str, Any] = {}
    has_dry_run = False
    for p in inspect.signature(fn).parameters.values():
        if p.name == "self":
            continue
        if p.name == "dry_run":
            has_dry_run = True
            continue
        if p.name not in hints:
            raise ValueError(f"{where}: parameter {p.name!r} needs a type annotation")
        default = ... if p.default is inspect.Parameter.empty else p.default
        fields[p.name] = (hints[p.name], pydantic.Field(default, description=arg_docs.get(p.name)))
    if has_dry_run and effect != "write":
        raise ValueError(f"{where}: only write tools take dry_run; declare effect='write'")
    try:
        model = pydantic.create_model(  # type: ignore[call-overload]
            f"{tool_name}_arguments", __config__=pydantic.ConfigDict(extra="forbid"), **fields
        )
        parameters = _strip_titles(model.model_json_schema())
    except pydantic.PydanticUserError as e:  # a type pydantic can neither check nor describe
        raise ValueError(_untyped_argument(where, fields, e)) from None
    return Tool(
        name=tool_name,
        description=summary,
        parameters=parameters,
        fn=fn,
        effect=effect,
        timeout_s=timeout_s,
        version=version,
        has_dry_run=has_dry_run,
        _args_model=model,
    )


def _untyped_argument(where: str, fields: dict[str, Any], error: Exception) -> str:
    """Which argument's type has no JSON schema, and what to type it with instead."""
    for name, (hint, _) in fields.items():
        try:
            pydantic.TypeAdapter(hint).json_schema()
        except pydantic.PydanticUserError:
            shown = getattr(hint, "__qualname__", None) or repr(hint)
            return (
                f"{where}: argument {name!r} is typed {shown}, which has no JSON schema for "
                "the model to fill in; type it with JSON types (str, int, float, bool, "
                "Literal[...], list[...], dict[str, ...]) or a pydantic model, dataclass or "
                "TypedDict of them, and build the object inside the tool"
            )
    return f"{where}: its arguments have no JSON schema ({type(error).__name__}: {error})"


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """First paragraph, and ``name: text`` entries of a Google-style ``Args:`` section."""
    summary = doc.split("\n\n", 1)[0].replace("\n", " ").strip()
    args: dict[str, str] = {}
    match = re.search(r"^Args:\n((?:[ \t]+.*\n?)+)", doc, re.MULTILINE)
    if match:
        current = None
        for line in match.group(1).splitlines():
            m = re.match(r"^\s+(\w+)(?:\s*\(.*?\))?:\s*(.*)$", line)
            if m and (current is None or len(line) - len(line.lstrip()) <= 4):
                current = m.group(1)
                args[current] = m.group(2).strip()
            elif current:
                args[current] += " " + line.strip()
    return summary, args


def _strip_titles(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _strip_titles(v) for k, v in schema.items() if k != "title"}
    if isinstance(schema, list):
        return [_strip_titles(v) for v in schema]
    return schema


class ToolSet:
    """An environment's tools by name. Strict: duplicate names raise; with the side-effect
    guard on, a write tool without a dry-run path is refused here, at registration."""

    def __init__(self, tools: Iterable[Tool], *, guard: bool = True) -> None:
        self._tools: dict[str, Tool] = {}
        for t in tools:
            if not isinstance(t, Tool):
                raise TypeError(f"expected a Tool (decorate it with @tool), got {t!r}")
            if t.name in self._tools:
                raise ValueError(f"tool {t.name!r} is registered twice")
            if guard and t.effect == "write" and not t.has_dry_run:
                raise ValueError(
                    f"tool {t.name!r} has effect='write' but no dry-run path; with the "
                    "side-effect guard on, every write tool takes `dry_run: bool` and, when it "
                    "is True, returns the intended effect without changing real state"
                )
            self._tools[t.name] = t

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __getitem__(self, name: str) -> Tool:
        return self._tools[name]

    def __iter__(self) -> typing.Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def names(self) -> list[str]:
        return list(self._tools)

    def schemas(self) -> list[dict[str, Any]]:
        return [t.schema() for t in self._tools.values()]

    def versions(self) -> dict[str, str]:
        return {t.name: t.version for t in self._tools.values()}
