"""Tools from typed callables: schemas, validation, and failures as classified values."""

from __future__ import annotations

import asyncio
import time
from typing import Literal

import pytest

from tracerl.envs import InfraError, PolicyError, ToolResult, tool
from tracerl.types import FaultKind


@tool(effect="read", timeout_s=0.2, version="3")
def search(query: str, k: int = 3, mode: Literal["bm25", "dense"] = "bm25") -> list[str]:
    """Search the corpus.

    Args:
        query: what to look for; a few keywords
            work best.
        k: how many passages to return.
        mode: retrieval method.
    """
    if query == "down":
        raise InfraError("503 from the index", FaultKind.SERVER_ERROR)
    if query == "refused":
        raise ConnectionRefusedError("index at :9200")
    if query == "slow":
        time.sleep(1.0)
    if query == "forbidden":
        raise PolicyError("queries about salaries are not allowed")
    if query == "bug":
        raise KeyError("oops")
    return [f"{mode}:{query}:{i}" for i in range(k)]


def test_schema_comes_from_signature_and_docstring():
    s = search.schema()["function"]
    assert s["name"] == "search" and s["description"] == "Search the corpus."
    props = s["parameters"]["properties"]
    assert props["query"] == {
        "type": "string",
        "description": "what to look for; a few keywords work best.",
    }
    assert props["k"]["type"] == "integer" and props["k"]["default"] == 3
    assert props["mode"]["enum"] == ["bm25", "dense"]
    assert s["parameters"]["required"] == ["query"]
    assert s["parameters"]["additionalProperties"] is False
    assert search.version == "3" and search.effect == "read"


def _call(args):
    return asyncio.run(search(args))


def test_valid_call_returns_content_and_latency():
    r = _call({"query": "paris", "k": 2})
    assert r.ok and r.content == '["bm25:paris:0", "bm25:paris:1"]' and r.latency_ms >= 0


@pytest.mark.parametrize(
    ("args", "kind", "retryable", "needle"),
    [
        ({"k": 2}, "invalid_arguments", False, "query: Field required"),
        ({"query": "x", "k": "many"}, "invalid_arguments", False, "k:"),
        ({"query": "x", "limit": 3}, "invalid_arguments", False, "limit"),
        ({"query": "x", "mode": "grep"}, "invalid_arguments", False, "mode"),
        ("not a dict", "invalid_arguments", False, "must be an object"),
        ({"query": "down"}, "server_error", True, "503"),
        ({"query": "refused"}, "connection_refused", True, "refused"),
        ({"query": "slow"}, "timeout", True, "timed out after 0.2 s"),
        ({"query": "forbidden"}, "forbidden_tool", False, "salaries"),
        ({"query": "bug"}, "unknown", False, "KeyError"),
    ],
)
def test_failures_are_classified_values(args, kind, retryable, needle):
    r = _call(args)
    assert isinstance(r, ToolResult) and not r.ok
    assert r.error.kind.value == kind and r.error.retryable is retryable
    assert needle in r.error.message and needle in r.content


def test_attribution_follows_the_kind():
    assert _call({"query": "down"}).error.attribution.value == "environment"
    assert _call({"k": 1}).error.attribution.value == "policy"
    assert _call({"query": "bug"}).error.attribution.value == "unknown"


def test_bad_tool_definitions_are_refused_with_a_reason():
    def undocumented(x: int) -> str:
        return ""

    with pytest.raises(ValueError, match="needs a docstring"):
        tool(undocumented)

    def untyped(x):
        """Doc."""

    with pytest.raises(ValueError, match="'x' needs a type annotation"):
        tool(untyped)

    def reader(x: int, dry_run: bool = False) -> str:
        """Doc."""

    with pytest.raises(ValueError, match="only write tools take dry_run"):
        tool(reader)
    with pytest.raises(ValueError, match="version"):
        tool(version="")(reader)


class Money:
    """A user's own class: pydantic can neither check it nor describe it to the model."""

    def __init__(self, cents: int) -> None:
        self.cents = cents


def test_an_argument_of_a_class_without_a_schema_is_named_with_its_tool():
    """Not pydantic's raw schema error: the tool, the argument, its type and what to do."""

    def refund(order_id: str, amount: Money) -> str:
        """Refund an order."""
        return ""

    with pytest.raises(ValueError) as e:
        tool(refund)
    said = str(e.value)
    assert said.startswith("tool 'refund' (")
    assert "argument 'amount' is typed Money, which has no JSON schema" in said
    assert "type it with JSON types" in said and "pydantic" not in type(e.value).__module__


def test_write_tools_receive_dry_run_and_hide_it_from_the_schema():
    seen = []

    @tool(effect="write")
    async def send(to: str, dry_run: bool = False) -> ToolResult:
        """Send a message.

        Args:
            to: recipient.
        """
        seen.append(dry_run)
        return ToolResult("sent", effect={"send": to})

    assert "dry_run" not in send.schema()["function"]["parameters"]["properties"]
    r = asyncio.run(send({"to": "ops"}, dry_run=True))
    assert seen == [True] and r.dry_run and r.effect == {"send": "ops"}
    # The model cannot switch the guard off by passing dry_run itself.
    sneaky = asyncio.run(send({"to": "x", "dry_run": False}, dry_run=True))
    assert sneaky.error.kind.value == "invalid_arguments" and seen == [True]
