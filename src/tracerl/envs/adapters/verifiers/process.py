"""tracerl's side of the verifiers worker: the process in verifiers' own virtual environment
(`worker.py` there), started once per training process and per configuration, and spoken to
in JSON lines.

`worker_for(spec)` starts it (or returns the running one) and waits until it has loaded the
taskset and started verifiers' serving resources: the environment's `prepare()` calls it,
before any episode's clock. `WorkerProcess.request` sends one request from any thread and
returns a future; a reader thread settles them as answers arrive, in any order. A worker
that dies fails every request in flight (and the next ones) with `WorkerDied`, naming the
tail of its log: an outage, the environment's.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import hashlib
import itertools
import json
import os
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from tracerl.errors import UserError

VENV = ".venv-verifiers"
PIP = (
    "make verifiers (or: python -m venv .venv-verifiers && "
    ".venv-verifiers/bin/pip install verifiers==0.4.0 uv)"
)
START_TIMEOUT_S = 300.0
STOP_GRACE_S = 5.0
FAILED_START_S = 60.0
"""How long a configuration whose worker failed to start fails fast, before it is tried again
(every episode's `prepare` would otherwise pay for the failed start again)."""
WORKER = Path(__file__).with_name("worker.py")


class WorkerDied(RuntimeError):
    """The verifiers worker is gone (or never started): every request fails with this."""


def verifiers_python(configured: str | None) -> str:
    """The Python that runs verifiers: `configured` (``env.kwargs.python``), else
    ``$TRACERL_VERIFIERS_PYTHON``, else ``.venv-verifiers/bin/python`` in the checkout or the
    working directory."""
    for where, origin in (
        (configured, "env.kwargs.python"),
        (os.environ.get("TRACERL_VERIFIERS_PYTHON"), "$TRACERL_VERIFIERS_PYTHON"),
    ):
        if where:
            if not Path(where).is_file():
                raise UserError(
                    f"verifiers: {origin}={where}: no such file",
                    "point it at the python of a virtual environment with verifiers installed",
                )
            return where
    checkout = Path(__file__).resolve().parents[5]
    for root in dict.fromkeys((checkout, Path.cwd())):
        python = root / VENV / "bin" / "python"
        if python.is_file():
            return str(python)
    raise UserError(
        f"verifiers: no virtual environment with verifiers ({VENV} in {checkout} or here, "
        "or $TRACERL_VERIFIERS_PYTHON)",
        f"install it: {PIP}; or set env.kwargs.python",
    )


class WorkerProcess:
    """One running worker: its process, its tasks and versions, its requests in flight."""

    def __init__(self, python: str, spec: dict[str, Any], log: Path) -> None:
        self.spec, self.log = spec, log
        self.ids = itertools.count(1)
        self.lock = threading.Lock()
        self.write_lock = threading.Lock()
        self.pending: dict[int, concurrent.futures.Future[dict[str, Any]]] = {}
        self.dead: str | None = None
        self.stderr_tail: deque[str] = deque(maxlen=40)
        log.parent.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [python, str(WORKER), json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        ready: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()
        self.pending[0] = ready
        threading.Thread(target=self._read, daemon=True).start()
        try:
            hello = ready.result(START_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            self.stop()
            raise WorkerDied(
                f"the verifiers worker did not start within {START_TIMEOUT_S:g} s ({self.log})"
            ) from None
        if not hello.get("ready"):
            self.stop()
            with self.log.open("a") as out:
                out.write(hello.get("traceback") or "")
            raise WorkerDied(
                f"the verifiers worker could not start: {hello.get('error')} (traceback in "
                f"{self.log})"
            )
        self.tasks: dict[str, list[dict[str, Any]]] = hello["tasks"]
        self.versions: dict[str, str] = hello.get("versions") or {}

    def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        with self.log.open("a") as out:
            for line in self.proc.stderr:
                out.write(line)
                out.flush()
                self.stderr_tail.append(line.rstrip())

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            rid = 0 if "ready" in message else message.get("id")
            with self.lock:
                future = self.pending.pop(rid, None)
            if future is not None and not future.done():
                future.set_result(message)
        code = self.proc.wait()
        tail = "\n".join(list(self.stderr_tail)[-8:])
        self._fail_all(
            f"the verifiers worker exited (code {code}); its log {self.log} ends:\n{tail}"
        )

    def _fail_all(self, why: str) -> None:
        with self.lock:
            self.dead = why
            pending, self.pending = list(self.pending.values()), {}
        for future in pending:
            if not future.done():
                future.set_exception(WorkerDied(why))

    def request(self, op: str, **fields: Any) -> concurrent.futures.Future[dict[str, Any]]:
        """Send one request (from any thread); its future holds the answer's ``result``, or
        raises: `WorkerDied` (an outage), or `RuntimeError` with the worker's error."""
        answer: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()
        out: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()
        with self.lock:  # registered before it is sent: its answer cannot come first
            if self.dead is not None:
                out.set_exception(WorkerDied(self.dead))
                return out
            rid = next(self.ids)
            self.pending[rid] = answer
        try:  # written outside `lock`: the reader settling answers never waits on a full pipe
            self._write({"id": rid, "op": op, **fields})
        except (OSError, ValueError) as e:
            with self.lock:
                self.pending.pop(rid, None)
            out.set_exception(WorkerDied(f"the verifiers worker is gone: {e}"))
            return out

        def settle(done: concurrent.futures.Future[dict[str, Any]]) -> None:
            if out.done():  # the caller gave up on it (a cancelled episode)
                return
            error = done.exception()
            if error is not None:
                out.set_exception(error)
            elif "error" in (message := done.result()):
                out.set_exception(RuntimeError(f"verifiers worker: {message['error']}"))
            else:
                out.set_result(message["result"])

        def given_up(done: concurrent.futures.Future[dict[str, Any]]) -> None:
            if done.cancelled() and not answer.done():  # stop the rollout in the worker
                with contextlib.suppress(OSError, ValueError):
                    self._write({"op": "cancel", "target": rid})

        answer.add_done_callback(settle)
        out.add_done_callback(given_up)
        return out

    def _write(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        with self.write_lock:
            self.proc.stdin.write(json.dumps(message) + "\n")
            self.proc.stdin.flush()

    def alive(self) -> bool:
        return self.dead is None and self.proc.poll() is None

    def stop(self) -> None:
        """Close its stdin (it stops serving and verifiers closes what it started), then
        terminate, then kill: each step gets a few seconds."""
        with contextlib.suppress(OSError, ValueError), self.write_lock:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        for action in (None, self.proc.terminate, self.proc.kill):
            if self.proc.poll() is not None:
                return
            if action is not None:
                action()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(STOP_GRACE_S)


_WORKERS: dict[str, WorkerProcess] = {}
_START_LOCK = threading.Lock()
_FAILED: dict[str, tuple[float, str]] = {}


def spec_key(spec: dict[str, Any]) -> str:
    """A worker configuration's name: tasks carry it so the agent finds their worker."""
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def running_worker(key: str) -> WorkerProcess | None:
    """The live worker of the configuration named `key`, if one was started here."""
    worker = _WORKERS.get(key)
    return worker if worker is not None and worker.alive() else None


def worker_for(spec: dict[str, Any], python: str | None = None) -> WorkerProcess:
    """The running worker for `spec` (started on first use, once per process): a worker
    that died is started again on the next call; one that failed to start fails fast, with
    the same error, for `FAILED_START_S`."""
    key = spec_key(spec)
    with _START_LOCK:
        worker = _WORKERS.get(key)
        if worker is not None and worker.alive():
            return worker
        if (failed := _FAILED.get(key)) is not None and time.monotonic() - failed[
            0
        ] < FAILED_START_S:
            raise WorkerDied(failed[1])
        from tracerl.cache import cache_dir

        log = cache_dir() / "verifiers" / f"worker-{os.getpid()}-{len(_WORKERS)}.log"
        try:
            worker = WorkerProcess(verifiers_python(python), spec, log)
        except WorkerDied as e:
            _FAILED[key] = (time.monotonic(), str(e))
            raise
        _FAILED.pop(key, None)
        _WORKERS[key] = worker
        return worker


@atexit.register
def _stop_all() -> None:
    for worker in list(_WORKERS.values()):
        try:
            worker.stop()
        except Exception as e:  # exiting anyway
            print(f"verifiers worker: stop failed: {e}", file=sys.stderr)
