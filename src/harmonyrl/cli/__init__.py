"""The ``harmonyrl`` command: one Typer app whose sub-commands live by idea in this package — :mod:`.run` (train, sft,
eval), :mod:`.study` (plan, presets, compare, sweep), :mod:`.inspect` (check-env, check-checkpoint, replay, show,
report), :mod:`.gate` (check-mismatch), :mod:`.rm` (reward models); :mod:`.common` is what they share and
:mod:`.plan` prints a run's plan and checks it. User mistakes end in a one-line error, never a traceback."""

from __future__ import annotations

import typer

from harmonyrl.cli import gate, inspect, run, study
from harmonyrl.cli.common import HELP_CONTEXT, HELP_MARKUP
from harmonyrl.cli.rm import rm_app

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Agentic RL for GPT-OSS-style models.",
    rich_markup_mode=HELP_MARKUP,
    context_settings=HELP_CONTEXT,
)
run.register(app)  # train, sft, eval
study.register(app)  # plan, presets, compare, sweep
inspect.register(app)  # check-env, check-checkpoint, replay, show, report
gate.register(app)  # check-mismatch: the sampler/trainer mismatch gate
app.add_typer(rm_app, name="rm")  # reward models: ``harmonyrl rm pairs`` / ``rm train``


def main() -> None:  # pragma: no cover - entry point convenience
    app()
