"""Live progress for long phases (SFT, RL, eval) with the key figures of the latest step."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class StepProgress:
    def __init__(self, console: Console) -> None:
        self._console = console
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def start(self, phase: str, total: int, done: int = 0) -> None:
        """A bar for ``total`` steps, ``done`` of them already complete (a resumed run)."""
        self._progress = Progress(
            TextColumn(f"[bold]{phase:>4}[/]"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.description}"),
            console=self._console,
            transient=False,
        )
        self._progress.start()
        self._task = self._progress.add_task("", total=total, completed=done)

    def advance(self, description: str) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, advance=1, description=description)

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
        self._progress, self._task = None, None
