"""`tracerl serve` as a user starts it: a subprocess on a free loopback port."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def tracerl_serve(*args: str) -> Iterator[str]:
    """Run ``tracerl serve ARGS --port 0``; yields its base URL, terminates it on exit."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tracerl.cli", "serve", *args, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        line = ""
        while "serving" not in line:
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "tracerl serve exited before serving"
        # keep reading what it prints, so a chatty server never blocks on a full pipe
        threading.Thread(target=proc.stdout.read, daemon=True).start()
        yield line.split(" on ", 1)[1].strip().removesuffix("/v1/completions")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
