"""What every ``harmonyrl`` sub-command shares: the console, the one-line error and the user errors it is for."""

from __future__ import annotations

from typing import Any, Literal

import typer
from rich.console import Console
from rich.markup import escape

from harmonyrl.errors import UserError
from harmonyrl.sandbox.limits import SandboxUnavailable

UNLIMITED_WIDTH = 100_000
"""The console's width without a terminal: nothing a run prints is that long, so no line is wrapped or cut."""


def make_console() -> Console:
    """Rich's console on a terminal. Sent to a file or a pipe (``harmonyrl train … > log``), rich would lay every
    line out for 80 columns (or ``$COLUMNS``), wrapping a run's first line and its summary mid-phrase and cutting
    table cells to ``…``; there the width is :data:`UNLIMITED_WIDTH`, so lines and tables are written whole. (Code
    that fills the width, a rule, draws it only on a terminal.)"""
    probe = Console()
    return probe if probe.is_terminal else Console(width=UNLIMITED_WIDTH)


console = make_console()

HELP_MARKUP: Literal["rich"] | None = "rich" if console.is_terminal else None
"""``--help`` on a terminal: typer's rich panels. Sent to a file: click's plain help (panels would either wrap
option help and defaults at 80 columns or stretch their borders across the unlimited width)."""
HELP_CONTEXT: dict[str, Any] = (
    {} if console.is_terminal else {"max_content_width": UNLIMITED_WIDTH, "terminal_width": UNLIMITED_WIDTH}
)
"""Click's settings for that plain help: one line per option, its help and ``[default: …]`` whole."""

USER_ERRORS: tuple[type[Exception], ...] = (UserError, FileExistsError, FileNotFoundError, SandboxUnavailable)
"""Failures caused by the user's input or set-up: one line, no traceback. :class:`~harmonyrl.errors.UserError` is
the base of harmonyrl's own (a bad checkpoint, a missing optional package, a malformed task file, more generated
problems than an env's settings allow, the user's own env or expert code failing, …); beside it an existing or
missing run folder and the sandbox's own (a leaf that imports nothing of harmonyrl) when bubblewrap cannot run."""


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print ``error: message`` (one line, no markup read from it) and return the exit to raise."""
    # escaped: a message quoting "[task-1 and 5 more tasks]" or a user's "[x]" is text, not a style tag to drop
    console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True, emoji=False)
    return typer.Exit(code=code)
