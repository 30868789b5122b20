"""What every ``harmonyrl`` sub-command shares: the console, the one-line error and the user errors it is for, the
common options (config, preset, overrides, resume) and how a run's config, preset and failures are read."""

from __future__ import annotations

import sys
import traceback
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from rich.console import Console
from rich.markup import escape

from harmonyrl.config import ConfigError, RunConfig, load_config
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


ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="YAML config file.")]
PresetOpt = Annotated[
    str | None,
    typer.Option("--preset", "-p", help="Named preset, applied before -c and the overrides ('list': list them)."),
]
OverridesArg = Annotated[
    list[str] | None, typer.Argument(help="Dotted overrides, e.g. rl.steps=10 rollout.group_size=4")
]


ResumeOpt = Annotated[Path | None, typer.Option("--resume", help="Continue this run folder from its last checkpoint.")]
OverwriteOpt = Annotated[
    bool, typer.Option("--overwrite", help="Replace an earlier run folder of the same name (deletes it).")
]


def run_failed(e: Exception) -> typer.Exit:
    """A run that stopped on an exception that is not the user's: one line, the traceback in the run folder's
    ``error.log`` (named by a note on the exception) or, when there is none, on stderr."""
    from harmonyrl.run.failure import TRACEBACK_NOTE, is_storage_error, storage_message

    if isinstance(e, OSError) and is_storage_error(e):  # before the run folder existed: nothing was kept
        return fail(storage_message(e, None))
    notes = [n for n in getattr(e, "__notes__", []) if n.startswith(TRACEBACK_NOTE)]
    if notes:
        where = notes[0]
    else:
        traceback.print_exception(e, file=sys.stderr)
        where = "traceback on stderr"
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    cause = f"{type(e).__name__}: {text}" if text else type(e).__name__
    return fail(f"the run stopped on an unexpected error: {cause} ({where})", code=1)


def interrupted(run_dir: Path, command: str) -> typer.Exit:
    """Ctrl-C: one line saying where the run got to and how to continue it (exit 130, the shell's for SIGINT).
    The folder is left as a kill would leave it: every completed step is checkpointed atomically."""
    from harmonyrl.run.folder import interrupted_message

    console.print(f"[yellow]{escape(interrupted_message(run_dir, command))}[/]", highlight=False, soft_wrap=True)
    return typer.Exit(code=130)


def config_of(config: Path | None, overrides: list[str] | None, preset: Path | None = None) -> RunConfig:
    try:
        return load_config(config, overrides or [], [] if preset is None else [preset])
    except ConfigError as e:
        raise fail(str(e)) from None


def print_presets() -> None:
    from harmonyrl import preset_files

    for p in preset_files.available():
        console.print(f"{p.name:<12} {p.description}", highlight=False, soft_wrap=True, markup=False)
    for p in preset_files.available(preset_files.algorithms_folder()):  # compare --algos NAME, not -p NAME
        console.print(f"{p.name:<12} (compare --algos) {p.description}", highlight=False, soft_wrap=True, markup=False)
    folder = preset_files.PRESETS_DIR
    console.print(f"(YAML files in {folder}; use one with -p NAME)", highlight=False, soft_wrap=True, markup=False)


def preset_file(name: str | None) -> Path | None:
    """The file of preset ``name``; ``list`` prints the presets and exits."""
    if name is None:
        return None
    if name == "list":
        print_presets()
        raise typer.Exit(0)
    from harmonyrl.preset_files import PresetError, find

    try:
        return find(name)
    except PresetError as e:
        raise fail(str(e)) from None


def one_process(command: str) -> None:
    """Refuse a torchrun launch of a command that runs in one process (its N copies would write one folder)."""
    from harmonyrl.distributed.world import LaunchError, launched_size

    try:
        size = launched_size()
    except LaunchError as e:
        raise fail(str(e)) from None
    if size > 1:
        raise fail(f"harmonyrl {command} runs in one process; under torchrun only `harmonyrl train` is sharded")
