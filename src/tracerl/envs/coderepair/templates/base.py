"""Module templates for the code-repair tasks: correct code, the bug sites it offers (one per
bug kind), visible tests (what the agent may run) and hidden acceptance tests (what grades).

A site is ``(kind, correct, buggy, issue)``: `correct` occurs exactly once in the module's
source, replacing it with `buggy` plants the bug, and `issue` is the report the agent gets.
Hidden tests exercise inputs the visible tests do not, so special-casing the visible tests'
inputs does not pass them. The tests use only the standard library (`unittest`).
"""

from __future__ import annotations

from dataclasses import dataclass

BUG_KINDS = (
    "off_by_one",
    "wrong_operator",
    "missing_edge_case",
    "wrong_default",
    "swapped_arguments",
    "exception_not_raised",
)


@dataclass(frozen=True)
class Site:
    kind: str
    correct: str
    buggy: str
    issue: str


@dataclass(frozen=True)
class Template:
    name: str
    module: str  # file name inside the package
    source: str
    sites: tuple[Site, ...]
    visible_tests: str
    hidden_tests: str
