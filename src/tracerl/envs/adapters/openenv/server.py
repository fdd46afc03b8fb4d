"""The OpenEnv server an environment talks to: one already running (a URL), or one tracerl
starts itself, once per process, before the first episode (`serve`, called from the
environment's ``prepare``): an ASGI app served by uvicorn in the Python that has openenv-core
(``.venv-openenv`` from ``make openenv``), or any command, on a free loopback port. Ready
when ``/health`` answers; its ``/metadata`` and ``/schema`` are read then, once. It stops
when the process exits (`stop_all`), and a server tracerl started from an app also stops by
itself when the process that started it is gone (killed outright, it cannot clean up).
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tracerl.errors import UserError

OPENENV_PIN = "openenv-core==0.3.0"
INSTALL = (
    "make openenv (or: python -m venv .venv-openenv && "
    f".venv-openenv/bin/pip install {OPENENV_PIN} and your environment's package)"
)
PYTHON_VAR = "TRACERL_OPENENV_PYTHON"
VENV = ".venv-openenv"
HOST = "127.0.0.1"

# Runs in the server's own Python (which has no tracerl): serve the app, and exit when the
# process that started it is gone.
BOOT = """
import importlib, os, sys, threading, time
import uvicorn
parent = os.getppid()
def orphaned():
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)
threading.Thread(target=orphaned, daemon=True).start()
module, _, name = sys.argv[1].partition(":")
app = getattr(importlib.import_module(module), name or "app")
uvicorn.run(app, host=sys.argv[2], port=int(sys.argv[3]), log_level="warning")
"""
VERSION = "import importlib.metadata as m; print(m.version('openenv-core'))"


class ServerError(UserError, RuntimeError):
    """The OpenEnv server could not be found or started: what, and the tail of its log."""


@dataclasses.dataclass(frozen=True)
class Launch:
    """How to reach the server: `url` of a running one, else `app` (``module:attribute``,
    served with uvicorn by `python`) or `command` (``{port}`` in it is the port), run in
    `cwd` (also on ``PYTHONPATH``) with `env` added to the environment."""

    url: str | None = None
    app: str | None = None
    command: tuple[str, ...] | None = None
    python: str | None = None
    cwd: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    start_timeout_s: float = 120.0

    def describe(self) -> str:
        return self.url or self.app or " ".join(self.command or ())


@dataclasses.dataclass
class Served:
    """A server that answers: its URL, what it says of itself, and (if tracerl started it)
    its process and log."""

    url: str
    metadata: dict[str, Any]
    schema: dict[str, Any]
    openenv_version: str | None = None
    process: subprocess.Popen[bytes] | None = None
    log: Path | None = None

    def alive(self) -> bool:
        return self.process is None or self.process.poll() is None


_SERVED: dict[Launch, Served] = {}
_LOCK = threading.Lock()


def serve(launch: Launch) -> Served:
    """The server `launch` names, answering: started (once per process) if tracerl starts
    it, started again if it died since."""
    with _LOCK:
        served = _SERVED.get(launch)
        if served is not None and served.alive():
            return served
        if served is not None:
            _stop(served)
        served = _connect(launch) if launch.url else _start(launch)
        _SERVED[launch] = served
        return served


def stop_all() -> None:
    """Stop every server this process started (at exit, and for tests)."""
    with _LOCK:
        for served in _SERVED.values():
            _stop(served)
        _SERVED.clear()


atexit.register(stop_all)


def find_python(configured: str | None = None) -> str:
    """The Python with openenv-core that serves an app: `configured`, else
    ``$TRACERL_OPENENV_PYTHON``, else ``.venv-openenv/bin/python`` in the working directory
    or the checkout, else this one when openenv imports here."""
    import importlib.util

    for where, origin in (
        (configured, "env.kwargs.python"),
        (os.environ.get(PYTHON_VAR), "$" + PYTHON_VAR),
    ):
        if where:
            if not Path(where).is_file():
                raise ServerError(f"{origin}={where}: no such file", INSTALL)
            return where
    checkout = Path(__file__).resolve().parents[5]
    for root in dict.fromkeys((Path.cwd(), checkout)):
        python = root / VENV / "bin" / "python"
        if python.is_file():
            return str(python)
    if importlib.util.find_spec("openenv") is not None:
        return sys.executable
    raise ServerError(
        f"openenv: no Python with openenv-core to serve the app (no {VENV}, no "
        f"${PYTHON_VAR}, and openenv does not import here)",
        f"install it: {INSTALL}; or set env.kwargs.python",
    )


@functools.cache
def openenv_version(python: str) -> str | None:
    """The openenv-core release installed for `python` (None if it cannot tell)."""
    try:
        out = subprocess.run([python, "-c", VERSION], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def free_port(host: str = HOST) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _connect(launch: Launch) -> Served:
    url = str(launch.url).rstrip("/")
    deadline = time.monotonic() + min(launch.start_timeout_s, 30.0)
    problem = _wait_healthy(url, deadline, None)
    if problem:
        raise ServerError(
            f"openenv: the server at {url} does not answer ({problem})",
            "start it first, or let tracerl start it: env.kwargs.app or env.kwargs.command",
        )
    return _described(url, launch.python and openenv_version(launch.python))


def _start(launch: Launch) -> Served:
    port = free_port()
    cwd = launch.cwd or os.getcwd()
    if launch.app:
        python = find_python(launch.python)
        argv = [python, "-c", BOOT, launch.app, HOST, str(port)]
        version = openenv_version(python)
    else:
        argv = [a.replace("{port}", str(port)) for a in launch.command or ()]
        version = openenv_version(launch.python) if launch.python else None
    env = {**os.environ, **dict(launch.env), "PORT": str(port)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (cwd, env.get("PYTHONPATH")) if p)
    env.pop("ENABLE_WEB_INTERFACE", None)  # the API alone (the web UI needs gradio)
    log = Path(tempfile.mkstemp(prefix="tracerl-openenv-", suffix=".log")[1])
    with log.open("wb") as out:
        try:
            process = subprocess.Popen(
                argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        except OSError as e:
            raise ServerError(f"openenv: cannot run {argv[0]}: {e}", INSTALL) from e
    url = f"http://{HOST}:{port}"
    served = Served(url, {}, {}, version, process, log)
    problem = _wait_healthy(url, time.monotonic() + launch.start_timeout_s, process)
    if problem:
        _stop(served)
        raise ServerError(
            f"openenv: the server for {launch.describe()} did not start ({problem}); "
            f"its log:\n{_tail(log)}",
            "check env.kwargs.app (module:attribute, importable from env.kwargs.cwd) and "
            f"that its Python has openenv-core ({INSTALL})",
        )
    described = _described(url, version)
    served.metadata, served.schema = described.metadata, described.schema
    return served


def _wait_healthy(url: str, deadline: float, process: subprocess.Popen[bytes] | None) -> str | None:
    """None once ``/health`` answers 200; else why not (the process exited, or time ran out)."""
    import httpx

    last = "no answer"
    with httpx.Client(timeout=5.0, trust_env=False) as http:
        while time.monotonic() < deadline:
            if process is not None and process.poll() is not None:
                return f"it exited with status {process.returncode}"
            try:
                r = http.get(f"{url}/health")
                if r.status_code == 200:
                    return None
                last = f"/health answered {r.status_code}"
            except httpx.HTTPError as e:
                last = f"{type(e).__name__}: {e}"
            time.sleep(0.2)
    return f"not ready in time: {last}"


def _described(url: str, version: str | None) -> Served:
    """The server's own account of itself: ``/metadata`` and ``/schema``."""
    import httpx

    out: dict[str, dict[str, Any]] = {}
    with httpx.Client(timeout=30.0, trust_env=False) as http:
        for what in ("metadata", "schema"):
            try:
                r = http.get(f"{url}/{what}")
                r.raise_for_status()
                out[what] = r.json() if isinstance(r.json(), dict) else {}
            except (httpx.HTTPError, ValueError) as e:
                raise ServerError(
                    f"openenv: {url}/{what} failed ({type(e).__name__}: {e}): is this an "
                    "OpenEnv server?",
                    "an OpenEnv server is made by openenv's create_app / create_fastapi_app",
                ) from e
    return Served(url, out["metadata"], out["schema"], version)


def _stop(served: Served) -> None:
    p = served.process
    if p is not None and p.poll() is None:
        _end(p)
    if served.log is not None:
        served.log.unlink(missing_ok=True)


def _end(p: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server's process group, SIGKILL it if it lingers."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(p.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            p.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(log: Path, lines: int = 30) -> str:
    text = log.read_text(errors="replace").splitlines() if log.is_file() else []
    return "\n".join(text[-lines:]) or "(empty)"
