"""A small OpenEnv text environment for the openenv adapter's tests, written the way
openenv's own template (``openenv init``) writes one: an ``Action`` and an ``Observation``
(`models`), an ``Environment`` and the app openenv's ``create_app`` makes of it (`server`).
No published OpenEnv environment installs from the package index here (they are published as
Hugging Face Spaces and Docker images), so the tests bring their own.

The task: add two numbers of one digit, answer with the sum alone. Learnable by a tiny model
(the answer is one or two digits) and not solved by a random one. The reward gives each
correct digit in place its share of 1 (``9`` for ``12`` scores 0), so a group has a gradient
before any reply is exactly right.

This module imports no openenv (the server runs in openenv's own environment, the solver in
tracerl's): the problem for a seed, its reward, and the solver check-env plays.
"""

from __future__ import annotations

import random
from typing import Any

INSTRUCTION = "Reply with the sum only."


def problem(seed: int | None) -> tuple[str, str]:
    """The question for `seed` and its answer."""
    rng = random.Random(seed)
    a, b = rng.randint(0, 9), rng.randint(0, 9)
    return f"What is {a} + {b}? {INSTRUCTION}", str(a + b)


def score(reply: str, answer: str) -> float:
    """1.0 for the answer; else each answer digit in its place earns 1/len, and every
    character beyond the answer's length costs as much (never below 0)."""
    text = reply.strip()
    if text == answer:
        return 1.0
    right = sum(1 for x, y in zip(text, answer, strict=False) if x == y)
    extra = max(0, len(text) - len(answer))
    return max(0.0, (right - extra) / len(answer))


def solve(task: dict[str, Any]) -> str:
    """The right reply to an adapter task (check-env's scripted episode)."""
    return problem(task["reset"]["seed"])[1]


def openenv_python() -> str:
    """The Python with openenv-core that serves the tests' environments; the calling test
    module is skipped without one (fails with ``$TRACERL_REQUIRE_OPENENV``: `make test`
    installs it)."""
    import os

    import pytest

    from tracerl.envs.adapters.openenv import ServerError, find_python

    try:
        return find_python()
    except ServerError as e:
        if os.environ.get("TRACERL_REQUIRE_OPENENV"):
            pytest.fail(f"openenv-core is required here (make test installs it): {e}")
        pytest.skip(f"openenv-core is not installed (make openenv): {e}", allow_module_level=True)
