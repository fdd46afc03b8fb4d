"""A server's keeper: runs a command in a process group of its own and ends the whole group
when the process that asked for it goes away, however it goes.

    python -m tracerl.engines.guard [--scratch DIR] FD PIDFILE -- COMMAND ...
    python -m tracerl.engines.guard [--scratch DIR] --parent PID PIDFILE -- COMMAND ...

The trainer starts this with the read end of a pipe (file descriptor `FD`) whose write end
only the trainer holds. The kernel closes that end when the trainer exits for any reason,
``kill -9`` included, so the guard reads end-of-file and stops the group: SIGTERM, then
SIGKILL after a grace period. Where the guard is started by code that cannot hand it a pipe
(an MCP server launched by the `mcp` SDK, whose stdin and stdout are the protocol), it
watches its parent instead: ``--parent PID`` stops the group as soon as its parent is no
longer `PID` (the kernel re-parents an orphan), checked twice a second. ``-`` as PIDFILE
writes none. A vLLM server is several processes (the API server, its
engine core, the worker); killing only the one the trainer started leaves the others
running with the model and its KV cache in memory, which is why the whole group goes.

The guard also ends when the command ends (the server crashed, or was killed): it kills
what is left of the group and exits with the command's status, so the trainer sees one
process to watch. It writes the command's pid to `PIDFILE`, and removes it when it stops
the group itself (its starter gone, or asking): the pid of a process that has ended names
nothing, and may name another process later. A server that ended on its own leaves the file
for its starter to read (the server is gone) and remove. The command gets
``PR_SET_PDEATHSIG`` (SIGTERM) so that it stops even if the guard itself is killed.

``--scratch DIR``: a folder made for the command's files (its log, or its temporary files:
vLLM's starter sets ``TMPDIR`` to it, since vLLM leaves its ZMQ sockets and ``vllm_dist_*``
files behind when it is stopped); removed with what is in it when the guard stops the group
itself, so a trainer killed with ``kill -9`` leaves nothing in ``/tmp`` either. Like the pid
file, it stays for the starter to read and remove when the server ended on its own.

Only the standard library: it runs before (and apart from) anything heavy.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import shutil
import signal
import subprocess
import sys
import time

GRACE_S = 10.0
PR_SET_PDEATHSIG = 1


def _die_with_parent(sig: int = signal.SIGTERM) -> None:  # in the child, before exec
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig)


def stop_group(pgid: int, grace_s: float = GRACE_S) -> None:
    """SIGTERM the process group, then SIGKILL whatever is left after `grace_s`."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not group_alive(pgid):
                return
            time.sleep(0.1)


def processes() -> list[tuple[int, int, int, str]]:
    """(pid, ppid, pgid, state) of every process, from ``/proc/<pid>/stat``."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        out.append((int(pid), int(fields[1]), int(fields[2]), fields[0]))
    return out


def group_alive(pgid: int) -> bool:
    """Whether any process of group `pgid` is still running (zombies do not count)."""
    return any(g == pgid and state != "Z" for _, _, g, state in processes())


USAGE = (
    "usage: python -m tracerl.engines.guard [--scratch DIR] FD PIDFILE -- COMMAND ...\n"
    "       python -m tracerl.engines.guard [--scratch DIR] --parent PID PIDFILE -- COMMAND ..."
)


def main(argv: list[str]) -> int:
    parent = scratch = None
    while argv[:1] in (["--parent"], ["--scratch"]) and len(argv) > 1:
        if argv[0] == "--scratch":
            scratch, argv = argv[1], argv[2:]
        elif argv[1].isdigit():
            parent, argv = int(argv[1]), ["-1", *argv[2:]]
        else:
            break
    if len(argv) < 4 or argv[2] != "--" or not argv[0].lstrip("-").isdigit():
        print(USAGE, file=sys.stderr)
        return 2
    return _guard(int(argv[0]), argv[1], argv[3:], parent, scratch)


def _guard(
    fd: int, pidfile: str, command: list[str], parent: int | None, scratch: str | None
) -> int:
    # a tool server, not a GPU engine: its starter (the MCP SDK) sends this guard SIGTERM
    # and SIGKILL 2 s later, so the guard must have ended the server well before that; a
    # guard killed outright takes the server with it (SIGKILL as its death signal)
    grace_s = GRACE_S if parent is None else 1.0
    death = signal.SIGTERM if parent is None else signal.SIGKILL
    stopping = False

    def _stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    try:
        child = subprocess.Popen(
            command, start_new_session=True, preexec_fn=lambda: _die_with_parent(death)
        )
    except OSError as e:  # the starter reads this in the command's log, and the status
        print(f"tracerl.engines.guard: cannot run {command[0]}: {e}", file=sys.stderr)
        return 127
    signal.signal(signal.SIGTERM, _stop)
    # Ctrl-C reaches the trainer's whole process group, this guard included: the trainer
    # finishes its step and checkpoints, on this server; the pipe says when it is done
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if pidfile != "-":
        with open(pidfile + ".tmp", "w") as f:
            f.write(str(child.pid))
        os.replace(pidfile + ".tmp", pidfile)
    while not stopping:
        if child.poll() is not None:  # the server ended: take what it left behind with it
            stop_group(child.pid, grace_s=2.0)
            return child.returncode
        if parent is not None:
            if os.getppid() != parent:  # re-parented: the trainer is gone
                break
            time.sleep(0.1)
            continue
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready and not os.read(fd, 1):  # end of file: the trainer is gone
            break
    stop_group(child.pid, grace_s)
    with contextlib.suppress(Exception):
        child.wait(timeout=1)
    # stopped here: nothing of the group writes any more, and its starter reads neither
    if pidfile != "-":
        with contextlib.suppress(OSError):
            os.unlink(pidfile)
    if scratch is not None:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
