"""Progress for long commands: a steps bar with its ETA and a bar for the episodes (or
batches) of the phase running now, with the one-line summaries printed above the bars.
A phase's bar also shows the model turns and tokens sampled since it began (`sampled`):
episodes served together finish together, and those counts move meanwhile.

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

    def phase(self, description: str, total: int, done: int = 0) -> None:
        pass

    def advance(self, _: Any = None) -> None:
        pass

    def line(self, text: str) -> None:
        self.log(text)


Counts = Callable[[], tuple[int, int]]
"""(turns, tokens) sampled so far (`tracerl.rollout.activity.ACTIVITY.totals`)."""


def _count(n: int) -> str:
    return f"{n / 1000:.1f}k" if n >= 10_000 else str(n)


class RichProgress(QuietProgress):
    """Rich bars on the console: ``steps`` (with ETA) and the current phase's items, with
    the turns and tokens `sampled` since the phase began."""

    def __init__(self, console: Any = None, sampled: Counts | None = None) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            ProgressColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.text import Text

        owner = self

        class Sampled(ProgressColumn):
            def render(self, task: Any) -> Text:
                return Text(owner.sampled_text() if task.id == owner._phase else "")

        self.console = console or Console()
        self._sampled = sampled
        self._since = sampled() if sampled is not None else (0, 0)
        super().__init__(lambda text: self.console.print(text, markup=False, highlight=False))
        self._bars = Progress(
            TextColumn("{task.description:<22}"),
            BarColumn(bar_width=10),  # the sampled counts still fit in 80 columns
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(compact=True),
            Sampled(),
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

    def sampled_text(self) -> str:
        """The turns and tokens sampled since the current phase began ('' before any)."""
        if self._sampled is None:
            return ""
        (turns, tokens), (turns0, tokens0) = self._sampled(), self._since
        turns, tokens = turns - turns0, tokens - tokens0
        return f"{_count(turns)} turns {_count(tokens)} tok" if turns else ""

    def phase(self, description: str, total: int, done: int = 0) -> None:
        """A phase of `total` items, `done` of them already (a phase taken up again)."""
        if self._sampled is not None:
            self._since = self._sampled()
        if self._phase is None:
            self._phase = self._bars.add_task(description, total=total, completed=done)
        else:
            self._bars.reset(self._phase, total=total, completed=done, description=description)

    def advance(self, _: Any = None) -> None:
        if self._phase is not None:
            self._bars.advance(self._phase)
