"""The ``harmonyrl`` command. Heavy imports (torch, transformers) happen inside the commands so that
``--help`` and config errors are instant. User mistakes end in a one-line error, never a traceback."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from harmonyrl.config import ConfigError, RunConfig, load_config
from harmonyrl.errors import CheckpointError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Agentic RL for GPT-OSS-style models.")
console = Console()

ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="YAML config file.")]
OverridesArg = Annotated[
    list[str] | None, typer.Argument(help="Dotted overrides, e.g. rl.steps=10 rollout.group_size=4")
]


def _fail(message: str) -> typer.Exit:
    console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code=2)


def _config(config: Path | None, overrides: list[str] | None) -> RunConfig:
    try:
        return load_config(config, overrides or [])
    except ConfigError as e:
        raise _fail(str(e)) from None


@app.command()
def train(config: ConfigOpt = None, overrides: OverridesArg = None) -> None:
    """SFT warm start, then RL on the environment, with held-out evaluation before and after."""
    cfg = _config(config, overrides)
    from harmonyrl.trainer.loop import train as run_train

    try:
        asyncio.run(run_train(cfg, console))
    except (FileExistsError, CheckpointError) as e:
        raise _fail(str(e)) from None


@app.command()
def sft(config: ConfigOpt = None, overrides: OverridesArg = None) -> None:
    """Supervised warm start only; writes RUN/checkpoints/sft for `train model.init_from=...`."""
    cfg = _config(config, overrides)
    from harmonyrl.trainer.loop import sft_only

    try:
        path = asyncio.run(sft_only(cfg, console))
    except (FileExistsError, CheckpointError) as e:
        raise _fail(str(e)) from None
    console.print(f"SFT checkpoint: [bold]{path}[/]")


@app.command(name="eval")
def evaluate(
    checkpoint: Annotated[Path, typer.Option("--checkpoint", help="Checkpoint folder (config.json + safetensors).")],
    config: ConfigOpt = None,
    overrides: OverridesArg = None,
) -> None:
    """Evaluate a checkpoint on the held-out split; prints a table and the metrics as JSON."""
    cfg = _config(config, overrides)
    from harmonyrl.trainer.loop import eval_only

    try:
        metrics = asyncio.run(eval_only(cfg, checkpoint, console))
    except CheckpointError as e:
        raise _fail(str(e)) from None
    import json

    console.print_json(json.dumps(metrics))


def main() -> None:  # pragma: no cover - entry point convenience
    app()
