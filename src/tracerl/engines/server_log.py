"""What a vLLM server's log says: the stage a starting server has reached, read as the log
grows (the user sees it while they wait: a first start on CPU compiles for minutes, later
ones load the cache), and why a server failed (`log_tail`).

    watch = StartupWatch(log_path)   # at the server's launch: reads only what comes after
    watch.poll()    # -> ["loading the weights"]: the stages reached since the last poll
    watch.compile   # "cached" / "compiled" / None: whether torch.compile's cache was used

The stages are vLLM 0.32's log lines (`STAGES`); a vLLM that words them otherwise still
starts, only with fewer stage lines.
"""

from __future__ import annotations

import re
from pathlib import Path

STARTING = "=== tracerl: starting vLLM"
"""How tracerl marks each start of a server in its log (a log holds every restart's)."""
LOG_TAIL_LINES = 40

STAGES: tuple[tuple[str, str], ...] = (
    ("Resolved architecture", "reading the model's config"),
    ("Initializing a V1 LLM engine", "starting the engine process"),
    ("Starting to load model", "loading the weights"),
    ("Starting torch.compile", "compiling the model (torch.compile)"),
    ("Dynamo bytecode transform", "compiling the model (torch.compile)"),
    ("Compiling a graph for compile range", "compiling graphs (once; cached for later starts)"),
    ("Directly load the compiled graph", "loading compiled graphs from the cache"),
    ("Warming up model", "warming up"),
    ("KV cache size", "allocating the KV cache"),
    ("Starting vLLM server on", "opening the HTTP server"),
)
"""(a piece of a vLLM log line, the stage it starts), in the order a start goes through."""


class StartupWatch:
    """Reads a server log from where it ends now, and names the stage its new lines reach."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.offset = log.stat().st_size if log.is_file() else 0
        self.partial = ""
        self.stage = "importing vLLM"
        self.reached = -1  # the index in STAGES of the latest stage seen
        self.compile: str | None = None

    def poll(self) -> list[str]:
        """The stages the log's new lines reached, in order (each stage once)."""
        try:
            with open(self.log, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            return []
        self.offset += len(chunk)
        text = self.partial + chunk.decode("utf-8", errors="replace")
        lines = text.split("\n")
        self.partial = lines.pop()  # a line still being written: kept for the next poll
        reached = [stage for line in lines if (stage := self.read(line)) is not None]
        return list(dict.fromkeys(reached))

    def read(self, line: str) -> str | None:
        """The stage `line` starts, if it moves the start forward."""
        for i, (piece, stage) in enumerate(STAGES):
            if piece in line:
                if piece == "Directly load the compiled graph":
                    self.compile = self.compile or "cached"
                elif piece == "Compiling a graph for compile range":
                    self.compile = "compiled"
                if i <= self.reached:  # stages only move forward
                    return None
                self.reached = i
                if stage == self.stage:  # two lines of one stage
                    return None
                self.stage = stage
                return stage
        return None


NOISE = ("Attempted to load weight", "nanobind", "leaked", "resource_tracker", "warnings.warn")
"""Log lines that say nothing about why a server failed (dtype casts, shutdown leak reports)."""


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` meaningful lines of a server log, after the first error it names
    (the cause: what a dying engine prints last is how it shut down)."""
    if not path.is_file():
        return "(no log)"
    text = path.read_text(errors="replace").splitlines()
    start = max((i for i, t in enumerate(text) if STARTING in t), default=0)
    keep = [t for t in text[start:] if t.strip() and not any(n in t for n in NOISE)]
    causes = [
        t.split("] ")[-1].strip()
        for t in keep
        if re.search(r"(^|\] )\w*(Error|Exception): ", t)  # raised, not warned about
        and "EngineDeadError" not in t
        and " WARNING " not in t
    ]
    cause = f"cause: {causes[0]}\n" if causes else ""
    return cause + "\n".join(keep[-lines:])
