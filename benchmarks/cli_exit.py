"""How long a command takes to exit once its work is done (after its last line), with and
without the CLI's exit hook (`tracerl.cli.common._collect_once_then_freeze`: one collection,
then the heap frozen, so the interpreter's shutdown collections skip what torch and
transformers left). Both sides run here, alternately, the same command.

Run: .venv/bin/python benchmarks/cli_exit.py [--model tiny-random] [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

# the tracerl command, with the hook on or (as before it) off
CLI = """
import sys
from tracerl.cli import app, common
if sys.argv[1] == "off":
    common._exit_hook.append(True)  # as if registered: nothing is
sys.argv = ["tracerl", *sys.argv[2:]]
app(prog_name="tracerl")
"""


def exit_seconds(hook: str, command: list[str]) -> float:
    """Seconds from the command's last line of output to its exit."""
    p = subprocess.Popen(
        [sys.executable, "-c", CLI, hook, *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert p.stdout is not None
    last = time.perf_counter()
    for _ in p.stdout:
        last = time.perf_counter()
    if p.wait() != 0:
        raise SystemExit(f"tracerl {' '.join(command)} failed (exit {p.returncode})")
    return time.perf_counter() - last


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-random")
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    command = ["load-model", a.model]
    times: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(a.runs):
        for hook in ("off", "on"):
            times[hook].append(exit_seconds(hook, command))
    off, on = statistics.median(times["off"]), statistics.median(times["on"])
    print(f"tracerl {' '.join(command)}: exit after its last line, median of {a.runs}")
    print(f"  without the hook  {off:5.2f} s   {' '.join(f'{t:.2f}' for t in times['off'])}")
    print(f"  with the hook     {on:5.2f} s   {' '.join(f'{t:.2f}' for t in times['on'])}")
    print(f"  ratio             {on / off:5.2f}")


if __name__ == "__main__":
    main()
