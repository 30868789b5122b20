"""``harmonyrl check-mismatch``: the mismatch gate (:mod:`harmonyrl.jobs.check_mismatch`) on the command line.

Runs N RL steps of the run the config describes against its engine (the embedded one, or a vLLM server with
``rollout.engine.kind=vllm``) and exits 1 with one line when the mean sampler-vs-trainer KL exceeds the bound of
the run's precision (or ``--max-kl``); 0 with one line when it does not; 2 on bad input. docs/mismatch-gate.md.
Registered on the app by :mod:`harmonyrl.cli`; torch is imported inside the command.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from harmonyrl.cli.common import USER_ERRORS, console, fail
from harmonyrl.config import ConfigError, RunConfig, load_config
from harmonyrl.jobs.check_mismatch import GATE_DEFAULTS, GateInputError, parse_bound, run_gate
from harmonyrl.preset_files import PresetError, find


def check_mismatch_cmd(
    overrides: Annotated[
        list[str] | None, typer.Argument(help="Dotted overrides of the run, e.g. rollout.engine.dtype=bfloat16")
    ] = None,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML config file.")] = None,
    preset: Annotated[str | None, typer.Option("--preset", "-p", help="Named preset, applied before -c.")] = None,
    steps: Annotated[int, typer.Option(min=1, help="RL steps whose mismatch is averaged (sets rl.steps).")] = 20,
    max_kl: Annotated[
        str | None,
        typer.Option(
            "--max-kl", help="Bound on the mean per-token KL (default: the precision's, docs/mismatch-gate.md)."
        ),
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Folder for the gate's run (default: a new temporary folder).")
    ] = None,
) -> None:
    """The mismatch gate: run N RL steps of the configured run and fail (exit 1, one line) when the mean
    sampler-vs-trainer KL (mismatch/kl_k3) exceeds the bound for the run's precision (fp32 or bf16)."""
    try:
        bound = parse_bound(max_kl)
    except GateInputError as e:
        raise fail(str(e)) from None
    cfg = _gate_config(config, overrides or [], preset, steps, out)
    try:
        result = asyncio.run(run_gate(cfg, bound, console))
    except USER_ERRORS as e:
        raise fail(str(e)) from None
    if not result.passed:
        raise fail(result.line(), code=1)
    console.print(f"[green]✓[/] {escape(result.line())}", highlight=False, soft_wrap=True)


def _gate_config(
    config: Path | None, overrides: list[str], preset: str | None, steps: int, out: Path | None
) -> RunConfig:
    """The gate's run: its defaults, then the user's file and overrides, then its steps and folder."""
    try:
        presets = [] if preset is None else [find(preset)]
    except PresetError as e:
        raise fail(str(e)) from None
    folder = out if out is not None else Path(tempfile.mkdtemp(prefix="harmonyrl-mismatch-gate-"))
    placed = [f"rl.steps={steps}", f"output_dir={folder}", "run_name=gate"]
    try:
        return load_config(config, [*GATE_DEFAULTS, *overrides, *placed], presets)
    except ConfigError as e:
        raise fail(str(e)) from None


def register(app: typer.Typer) -> None:
    """Add ``check-mismatch`` to ``app``."""
    app.command(name="check-mismatch")(check_mismatch_cmd)
