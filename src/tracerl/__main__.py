"""``python -m tracerl``: the `tracerl` command, for launchers that start modules
(``torchrun --nproc-per-node 2 -m tracerl train CONFIG``)."""

from tracerl.cli import app

if __name__ == "__main__":
    app(prog_name="tracerl")
