"""Live progress for long phases (SFT, RL, eval) with the key figures of the latest step.

On a terminal, a rich bar redrawn in place. Anywhere else (``nohup … > log``, CI, a pipe) a bar prints
nothing until it stops, so a whole run would look dead: there, plain lines are printed instead — one when a
phase starts, one at most every ``every_s`` seconds (``telemetry.progress_every_s``) and one when it ends —
each with the phase, step/total, the latest figures, elapsed time and an ETA. Rich flushes every print, so
the lines reach a log file as they happen.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

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

T = TypeVar("T")


def clock_text(seconds: float) -> str:
    """``h:mm:ss``, as rich's elapsed/remaining columns show time."""
    s = max(0, round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def duration_text(minutes: float) -> str:
    """A run's length for people: ``42 s`` under a minute (``0.0 min`` says nothing), ``3.4 min`` under an hour,
    then ``1 h 05 min``."""
    seconds = max(0.0, minutes * 60)
    if seconds < 59.5:
        return f"{seconds:.0f} s"
    if minutes < 59.95:
        return f"{minutes:.1f} min"
    whole = round(minutes)
    return f"{whole // 60} h {whole % 60:02d} min"


def progress_line(phase: str, done: int, total: int, elapsed_s: float, steps_run: int, description: str) -> str:
    """One plain progress line. The ETA extrapolates this session's pace (``steps_run`` steps in
    ``elapsed_s``), so a resumed run's skipped steps do not make it look fast."""
    eta = clock_text(elapsed_s / steps_run * (total - done)) if steps_run > 0 else "?"
    pct = f"{done / total:.0%}" if total else "-"
    figures = f"  {description}" if description else ""
    return f"[{phase}] step {done}/{total} ({pct}){figures}  elapsed {clock_text(elapsed_s)}  eta {eta}"


class StepProgress:
    """Progress of one phase at a time: :meth:`start`, :meth:`advance` per step, :meth:`stop`."""

    def __init__(self, console: Console, every_s: float = 15.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._console = console
        self._plain = not console.is_terminal
        self._every_s = every_s
        self._clock = clock
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        # plain mode: the phase being tracked
        self._phase = ""
        self._total = self._done = self._first = 0
        self._t0 = self._last_print = 0.0
        self._printed_done = -1
        self._description = ""

    def start(self, phase: str, total: int, done: int = 0) -> None:
        """Track ``total`` steps, ``done`` of them already complete (a resumed run)."""
        if self._plain:
            self._phase, self._total, self._done, self._first = phase, total, done, done
            self._t0 = self._last_print = self._clock()
            self._description, self._printed_done = "", done
            self._print(f"[{phase}] resumed at step {done}/{total}" if done else f"[{phase}] started: {total} steps")
            return
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
        """One more step done; ``description`` holds its key figures (e.g. ``loss 0.412``)."""
        if self._plain:
            self._done, self._description = self._done + 1, description
            if self._clock() - self._last_print >= self._every_s:
                self._print_step()
            return
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, advance=1, description=description)

    def stop(self) -> None:
        """End the phase (a plain run prints its last step if that was not printed yet)."""
        if self._plain:
            if self._phase and self._printed_done != self._done:
                self._print_step()
            self._phase = ""
            return
        if self._progress is not None:
            self._progress.stop()
        self._progress, self._task = None, None

    async def during(self, phase: str, detail: str, work: Awaitable[T]) -> T:
        """Await ``work``, a phase without steps (held-out evaluation): a spinner on a terminal (unless a bar
        is live), else a line at its start, one every ``every_s`` seconds (at least 1 s) and one at its end."""
        if not self._plain:
            if self._progress is not None:  # rich allows one live display at a time
                return await work
            with self._console.status(f"{phase}: {detail}"):
                return await work
        t0 = self._clock()
        self._print(f"[{phase}] {detail}: started")
        beat = asyncio.ensure_future(self._heartbeat(phase, detail, t0))
        try:
            result = await work
        finally:
            beat.cancel()
        self._print(f"[{phase}] {detail}: done  elapsed {clock_text(self._clock() - t0)}")
        return result

    async def _heartbeat(self, phase: str, detail: str, t0: float) -> None:
        while True:
            await asyncio.sleep(max(self._every_s, 1.0))
            self._print(f"[{phase}] {detail}: running  elapsed {clock_text(self._clock() - t0)}")

    def _print_step(self) -> None:
        now = self._clock()
        self._print(
            progress_line(
                self._phase, self._done, self._total, now - self._t0, self._done - self._first, self._description
            )
        )
        self._last_print, self._printed_done = now, self._done

    def warn(self, line: str) -> None:
        """A one-line warning on the run's console (yellow on a terminal), its text printed as is."""
        self._console.print(f"warning: {line}", style="yellow", markup=False, highlight=False, soft_wrap=True)

    def _print(self, line: str) -> None:
        self._console.print(line, markup=False, highlight=False, soft_wrap=True)
