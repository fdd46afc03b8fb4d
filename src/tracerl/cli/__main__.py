"""``python -m tracerl.cli``: the `tracerl` command (as ``python -m tracerl``)."""

from tracerl.cli import app

if __name__ == "__main__":
    app()
