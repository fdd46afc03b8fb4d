"""The real `tracerl` command, run as a user runs it: a process of its own, the cache given,
no ``--debug`` from the environment. What the tests of its messages and exit statuses call."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TRACERL = Path(sys.executable).with_name("tracerl")


def run_tracerl(
    args: list[str],
    cwd: Path,
    cache: Path,
    *,
    env: dict[str, str] | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """``tracerl ARGS`` in `cwd` with ``TRACERL_CACHE=cache`` (and `env` on top)."""
    environ = {**os.environ, "TRACERL_CACHE": str(cache), **(env or {})}
    environ.pop("TRACERL_DEBUG", None)
    return subprocess.run(
        [str(TRACERL), *args], cwd=cwd, env=environ, capture_output=True, text=True, timeout=timeout
    )


def wait_healthy(base: str, timeout: float = 120) -> None:
    """Wait until the server at `base` (``http://host:port``, one the real command started)
    answers ``GET /health`` with 200, or `timeout` seconds have passed (the test's own
    requests then say what is wrong)."""
    import time

    import httpx

    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if httpx.get(base + "/health").status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.2)
