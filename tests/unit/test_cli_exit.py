"""A command ends without the interpreter's shutdown collections walking what torch and
transformers left behind (`tracerl.cli.common._collect_once_then_freeze`): at exit the heap
is frozen, after one collection that still runs what garbage there is to finalize.
`benchmarks/cli_exit.py` measures what that saves."""

from __future__ import annotations

import subprocess
import sys

# an exit hook registered before the command's (atexit runs the last registered first): it
# sees the heap as the interpreter's shutdown will, and whether a cycle's finalizer ran
PROBE = """
import atexit, gc, sys
atexit.register(lambda: print("frozen", gc.get_freeze_count() > 0, flush=True))

class Cycle:
    def __del__(self):
        print("finalized", flush=True)

def garbage_cycle():
    a = Cycle(); a.me = a

from tracerl.cli import app
garbage_cycle()  # unreachable, left for the collector
sys.argv = ["tracerl", *sys.argv[1:]]
app(prog_name="tracerl")
"""


def _run(*command: str) -> list[str]:
    gc_off = "import gc; gc.disable()\n"  # nothing collected before exit but by the hook
    r = subprocess.run(
        [sys.executable, "-c", gc_off + PROBE, *command], capture_output=True, text=True
    )
    return r.stdout.splitlines()


def test_every_command_exits_with_its_heap_frozen_after_its_garbage_is_finalized():
    out = _run("version")
    assert out[-2:] == ["finalized", "frozen True"], out
    out = _run("list")  # another command, which exits the same way
    assert out[-1] == "frozen True" and "finalized" in out, out
