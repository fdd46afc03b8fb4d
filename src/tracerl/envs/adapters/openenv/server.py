"""The OpenEnv server an environment talks to: one already running (a URL), or one tracerl
starts itself, once per process, before the first episode (`serve`, called from the
environment's ``prepare``): an ASGI app served by uvicorn in the Python that has openenv-core
(``.venv-openenv`` from ``make openenv``), or any command, on a free loopback port. Ready
when ``/health`` answers; its ``/metadata`` and ``/schema`` are read then, once. It stops
when the process exits (`stop_all`). A server tracerl starts runs in a process group of its
own behind `tracerl.engines.guard` (started by name: it is the engines' layer, above this
one), which holds the read end of a pipe only this process writes: when this process is gone,
however it went (``kill -9`` included, which runs no clean-up), the guard stops the server's
whole group, a command's children with it.

The port is never one another server could hold: an app's server binds a free port itself
and writes it to a file tracerl reads; a command needs its port on its command line, so
tracerl picks one, and where Linux's ``/proc`` tells, a server that was running before the
command and answers there took the port first: an error, not the server.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import os
import shutil
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

# Runs in the server's own Python (which has no tracerl): bind a free port, write it to the
# file argv[3] names (whole, by rename), serve the app there, and exit when the process that
# started it is gone.
BOOT = """
import importlib, os, socket, sys, threading, time
import uvicorn
parent = os.getppid()
def orphaned():
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)
threading.Thread(target=orphaned, daemon=True).start()
module, _, name = sys.argv[1].partition(":")
app = getattr(importlib.import_module(module), name or "app")
sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
sock.bind((sys.argv[2], 0))
with open(sys.argv[3] + ".part", "w") as f:
    f.write(str(sock.getsockname()[1]))
os.replace(sys.argv[3] + ".part", sys.argv[3])
uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
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
    """Its guard (`tracerl.engines.guard`): running while the server runs, its status then."""
    log: Path | None = None
    """Its output, in a folder of its own (removed when it stops)."""
    pipe: int | None = None
    """The write end of the guard's pipe: closed, the guard stops the server."""

    def alive(self) -> bool:
        return self.process is None or self.process.poll() is None

    @property
    def server_pid(self) -> int | None:
        """The server's own pid (the leader of its process group), once the guard wrote it."""
        try:
            return int((self.log.parent / "server.pid").read_text()) if self.log else None
        except (OSError, ValueError):
            return None


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
    cwd = launch.cwd or os.getcwd()
    python = find_python(launch.python) if launch.app else None
    folder = Path(tempfile.mkdtemp(prefix="tracerl-openenv-"))
    log, port_file = folder / "server.log", folder / "port"
    env = {**os.environ, **dict(launch.env)}
    if python is not None:  # an app: it binds a free port itself and writes it to port_file
        argv, port = [python, "-c", BOOT, launch.app, HOST, str(port_file)], None
        version = openenv_version(python)
    else:
        port = free_port()
        argv = [a.replace("{port}", str(port)) for a in launch.command or ()]
        version = openenv_version(launch.python) if launch.python else None
        env["PORT"] = str(port)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (cwd, env.get("PYTHONPATH")) if p)
    env.pop("ENABLE_WEB_INTERFACE", None)  # the API alone (the web UI needs gradio)
    runnable = argv[0] if os.sep in argv[0] else shutil.which(argv[0], path=env.get("PATH"))
    if runnable is None or not os.access(Path(cwd, runnable), os.X_OK):
        shutil.rmtree(folder, ignore_errors=True)
        raise ServerError(f"openenv: cannot run {argv[0]}: not an executable file", INSTALL)
    read, pipe = os.pipe()
    # the guard removes `folder` if it stops the server because this process is gone
    guard = [sys.executable, "-m", "tracerl.engines.guard", "--scratch", str(folder)]
    with log.open("wb") as out:
        try:
            process = subprocess.Popen(
                [*guard, str(read), str(folder / "server.pid"), "--", *argv],
                cwd=cwd,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                pass_fds=(read,),
            )
        except OSError as e:
            os.close(pipe)
            shutil.rmtree(folder, ignore_errors=True)
            raise ServerError(f"openenv: cannot run {sys.executable}: {e}", INSTALL) from e
        finally:
            os.close(read)
    deadline, problem = time.monotonic() + launch.start_timeout_s, None
    if port is None:
        port, problem = _reported_port(port_file, deadline, process)
    url = f"http://{HOST}:{port}"
    served = Served(url, {}, {}, version, process, log, pipe)
    problem = problem or _wait_healthy(url, deadline, process)
    if not problem and launch.command and _foreign(process, port or 0):
        problem = f"port {port} is another process's, not the command's (it took it first)"
    if problem:
        tail = _tail(log)  # read first: the guard removes its folder when it stops the server
        _stop(served)
        raise ServerError(
            f"openenv: the server for {launch.describe()} did not start ({problem}); "
            f"its log:\n{tail}",
            "check env.kwargs.app (module:attribute, importable from env.kwargs.cwd) and "
            f"that its Python has openenv-core ({INSTALL})",
        )
    try:
        described = _described(url, version)
    except ServerError:  # not an OpenEnv server: stopped, not left running
        _stop(served)
        raise
    served.metadata, served.schema = described.metadata, described.schema
    return served


def _reported_port(
    path: Path, deadline: float, process: subprocess.Popen[bytes]
) -> tuple[int | None, str | None]:
    """The port an app's server bound, once it wrote it to `path`; else why not."""
    while time.monotonic() < deadline:
        if path.is_file():
            return int(path.read_text()), None
        if process.poll() is not None:
            return None, f"it exited with status {process.returncode}"
        time.sleep(0.1)
    return None, "not ready in time: it bound no port"


def _foreign(process: subprocess.Popen[bytes], port: int) -> bool:
    """Whether what listens on `port` is a process that ran before the command did: one
    that took the port first, not the command's server (Linux's /proc, where it can read a
    process's sockets; False where it cannot tell). A listener started after the command,
    its own or one it asked for (``docker run -p``: docker's proxy), is the command's."""
    listening = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:  # sl local_address rem_address st ... inode
            cols = row.split()
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                listening.add(f"socket:[{cols[9]}]")
    born = _started(process.pid)
    if not listening or born is None:
        return False
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            holds = any(os.readlink(fd) in listening for fd in (entry / "fd").iterdir())
        except OSError:  # gone, or not ours to read
            continue
        started = _started(int(entry.name)) if holds else None
        if started is not None and started < born:
            return True
    return False


def _started(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot), None if it cannot tell."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rpartition(")")[2].split()[19])  # field 22, starttime
    except (OSError, ValueError, IndexError):
        return None


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
    _end(served)
    if served.log is not None:
        shutil.rmtree(served.log.parent, ignore_errors=True)


def _end(served: Served) -> None:
    """Stop the server's process group: its guard's pipe closed, the guard sends SIGTERM,
    then SIGKILL to what lingers; the group killed here if the guard itself does not end."""
    pid = served.server_pid  # read first: the guard removes the file once it stopped it
    if served.pipe is not None:
        with contextlib.suppress(OSError):
            os.close(served.pipe)
        served.pipe = None
    p = served.process
    if p is None:
        return
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


def _tail(log: Path, lines: int = 30) -> str:
    text = log.read_text(errors="replace").splitlines() if log.is_file() else []
    return "\n".join(text[-lines:]) or "(empty)"
