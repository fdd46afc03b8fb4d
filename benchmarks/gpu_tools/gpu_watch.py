"""Watch the GPU's memory and this run's processes while `make gpu-check` runs.

Every second, until SIGTERM or SIGINT:
* ``nvidia-smi --query-gpu=memory.used`` (when nvidia-smi is there): the memory in use at the
  start (before any part ran), its peak, and at the end; and the processes nvidia-smi lists
  as holding memory, each marked as this run's (a descendant of ROOT_PID) or not;
* every descendant of ROOT_PID whose memory maps hold JAX (``/jaxlib/``, ``jax_plugins``):
  the trap where a library imports JAX and JAX takes 75% of the GPU, unless the process's
  ``JAX_PLATFORMS`` is ``cpu``.
On stop it takes one last sample and writes its findings to OUT_TXT, one line each.

Usage: python benchmarks/gpu_tools/gpu_watch.py ROOT_PID OUT_TXT [READY_FILE]
READY_FILE is created once the first sample is taken (the caller waits for it, so that the
start memory is read before any part begins).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

JAX_MARKS = ("/jaxlib/", "jax_plugins", "libjax")
FOREIGN_MIB = 512  # memory in use before the run that says something else holds the GPU


@dataclass
class Seen:
    """What the samples found so far."""

    start_mib: list[int] | None = None
    total_mib: list[int] = field(default_factory=list)
    peak_mib: list[int] = field(default_factory=list)
    peak_at_s: float = 0.0
    last_mib: list[int] = field(default_factory=list)
    apps: dict[int, dict] = field(default_factory=dict)  # pid -> name, peak, ours
    jax: dict[int, str] = field(default_factory=dict)  # pid -> what it is, and its platform
    samples: int = 0
    smi_errors: int = 0


def smi(*query: str) -> list[list[str]] | None:
    """nvidia-smi's CSV rows for `query` (``--query-gpu=...``), or None if it failed."""
    try:
        done = subprocess.run(
            ["nvidia-smi", *query, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return [[c.strip() for c in ln.split(",")] for ln in done.stdout.splitlines() if ln.strip()]


def descendants(root: int) -> set[int]:
    """The pids whose chain of parents reaches `root` (root itself excluded)."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        parent[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: set[int] = set()
    for pid in parent:
        p = pid
        while p in parent and p not in (0, 1):
            p = parent[p]
            if p == root:
                found.add(pid)
                break
    return found


def cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return " ".join(raw.replace(b"\0", b" ").decode(errors="replace").split())[:140]


def jax_platforms(pid: int) -> str:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return "?"
    for item in env:
        if item.startswith(b"JAX_PLATFORMS="):
            return item.split(b"=", 1)[1].decode() or "(empty)"
    return "(unset)"


def loads_jax(pid: int) -> bool:
    try:
        maps = Path(f"/proc/{pid}/maps").read_text(errors="replace")
    except OSError:
        return False
    return any(mark in maps for mark in JAX_MARKS)


def sample(seen: Seen, root: int, t0: float, have_smi: bool) -> None:
    ours = descendants(root) - {os.getpid()}
    for pid in ours - set(seen.jax):
        if loads_jax(pid):
            seen.jax[pid] = f"{cmdline(pid)} [JAX_PLATFORMS={jax_platforms(pid)}]"
    seen.samples += 1
    if not have_smi:
        return
    gpus = smi("--query-gpu=memory.used,memory.total")
    if gpus is None:
        seen.smi_errors += 1
        return
    used = [int(float(r[0])) for r in gpus]
    seen.last_mib = used
    if seen.start_mib is None:
        seen.start_mib, seen.total_mib = used, [int(float(r[1])) for r in gpus]
    if sum(used) > sum(seen.peak_mib or [0]):
        seen.peak_mib, seen.peak_at_s = used, time.monotonic() - t0
    for row in smi("--query-compute-apps=pid,used_memory,process_name") or []:
        if len(row) < 3 or not row[0].isdigit():
            continue
        pid = int(row[0])
        number = re.match(r"[0-9.]+", row[1])  # "[N/A]" where the driver will not say
        mib = int(float(number.group())) if number else 0
        app = seen.apps.setdefault(
            pid, {"name": cmdline(pid) if pid in ours else row[2], "peak": 0, "ours": pid in ours}
        )
        app["peak"] = max(app["peak"], mib)


def findings(seen: Seen, have_smi: bool) -> list[str]:
    lines = []
    if not have_smi:
        lines.append("nvidia-smi: not on this machine (no GPU memory to report)")
    elif seen.start_mib is None:
        lines.append(f"nvidia-smi: every query failed ({seen.smi_errors} of {seen.samples})")
    else:
        gib = "/".join(f"{m / 1024:.1f}" for m in seen.total_mib)
        lines.append(
            f"GPU memory used (MiB, of {gib} GiB): at the start {seen.start_mib}, peak "
            f"{seen.peak_mib} (+{seen.peak_at_s:.0f}s), at the end {seen.last_mib}; "
            f"{seen.samples} samples"
        )
        foreign = [a for a in seen.apps.values() if not a["ours"]]
        if seen.apps:
            lines.append(
                "processes on the GPU (peak MiB): "
                + "; ".join(
                    f"{pid} {'ours' if a['ours'] else 'NOT OURS'} {a['peak']} {a['name'][:80]}"
                    for pid, a in sorted(seen.apps.items())
                )
            )
        else:
            lines.append("processes on the GPU: nvidia-smi listed none (a container hides them)")
        before = sum(seen.start_mib) > FOREIGN_MIB
        held = "yes" if foreign or before else "no"
        why = []
        if before:
            why.append(f"{sum(seen.start_mib)} MiB in use before the parts started")
        if foreign:
            why.append(f"{len(foreign)} process(es) not of this run")
        lines.append(
            f"GPU memory held by anything other than this run: {held}"
            + (f" ({'; '.join(why)})" if why else "")
        )
    if seen.jax:
        lines.append(
            "this run's processes that loaded JAX: "
            + "; ".join(f"{pid} {what}" for pid, what in sorted(seen.jax.items()))
        )
    else:
        lines.append("this run's processes that loaded JAX: none")
    return lines


def main() -> None:
    if len(sys.argv) not in (3, 4):
        raise SystemExit(__doc__)
    root, out = int(sys.argv[1]), Path(sys.argv[2])
    ready = Path(sys.argv[3]) if len(sys.argv) == 4 else None
    have_smi = shutil.which("nvidia-smi") is not None
    seen, t0, stop = Seen(), time.monotonic(), []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(1))
    sample(seen, root, t0, have_smi)
    if ready:
        ready.touch()
    while not stop:
        time.sleep(1.0)
        if not stop:
            sample(seen, root, t0, have_smi)
    sample(seen, root, t0, have_smi)  # the end: what is still held once the parts are done
    out.write_text("\n".join(findings(seen, have_smi)) + "\n")


if __name__ == "__main__":
    main()
