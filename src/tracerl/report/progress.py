"""Progress for long commands: a steps bar with its ETA and a bar for the episodes (or
batches) of the phase running now, with the one-line summaries printed above the bars.

`Progress` is what the training loop talks to; `QuietProgress` (the default) only prints
the summary lines, so library callers and tests get plain output.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class QuietProgress:
    """No bars: summary lines go to `log`."""

    def __init__(self, log: Callable[[str], None] = print) -> None:
        self.log = log

    def __enter__(self) -> QuietProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def steps(self, total: int, done: int = 0) -> None:
        pass

    def step_done(self) -> None:
        pass

    def phase(self, description: str, total: int) -> None:
        pass

    def advance(self, _: Any = None) -> None:
        pass

    def line(self, text: str) -> None:
        self.log(text)


class RichProgress(QuietProgress):
    """Rich bars on the console: ``steps`` (with ETA) and the current phase's items."""

    def __init__(self, console: Any = None) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.console = console or Console()
        super().__init__(lambda text: self.console.print(text, markup=False, highlight=False))
        self._bars = Progress(
            TextColumn("{task.description:<22}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )
        self._steps: Any = None
        self._phase: Any = None

    def __enter__(self) -> RichProgress:
        self._bars.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._bars.stop()

    def steps(self, total: int, done: int = 0) -> None:
        self._steps = self._bars.add_task("steps", total=total, completed=done)

    def step_done(self) -> None:
        if self._steps is not None:
            self._bars.advance(self._steps)

    def phase(self, description: str, total: int) -> None:
        if self._phase is None:
            self._phase = self._bars.add_task(description, total=total)
        else:
            self._bars.reset(self._phase, total=total, description=description)

    def advance(self, _: Any = None) -> None:
        if self._phase is not None:
            self._bars.advance(self._phase)
