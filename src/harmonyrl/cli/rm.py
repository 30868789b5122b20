"""``harmonyrl rm …``: reward models (docs/rewards.md). ``rm pairs`` makes preference pairs from a checkpoint and the
env's code checkers; ``rm train`` trains a Bradley–Terry reward model on pairs. Heavy imports inside the commands;
user mistakes are one line, as in :mod:`harmonyrl.cli`."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from harmonyrl.cli.common import HELP_MARKUP, console, fail
from harmonyrl.config import ConfigError, load_config, parse_override
from harmonyrl.envs.loader import UserCodeError
from harmonyrl.errors import CheckpointError
from harmonyrl.rewards.config import RMTrainConfig
from harmonyrl.rewards.pair_files import PairFileError

rm_app = typer.Typer(
    no_args_is_help=True,
    help="Reward models: preference pairs, Bradley–Terry training.",
    rich_markup_mode=HELP_MARKUP,
)
USER_ERRORS = (ConfigError, PairFileError, CheckpointError, UserCodeError, FileExistsError, FileNotFoundError)


def rm_train_config(overrides: list[str]) -> RMTrainConfig:
    """The ``rm train`` settings from ``key=value`` overrides; :class:`ConfigError` (one line) on any mistake."""
    tree = dict(parse_override(o) for o in overrides)
    try:
        return RMTrainConfig.model_validate(tree)
    except ValidationError as e:
        err = e.errors()[0]
        key = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        raise ConfigError(f"rm train: {key + ': ' if key else ''}{msg}") from None


@rm_app.command("train")
def train_cmd(
    overrides: Annotated[
        list[str] | None, typer.Argument(help="key=value settings, e.g. data=pairs.jsonl init_from=CKPT steps=200")
    ] = None,
) -> None:
    """Train a reward model (GPT-OSS trunk + scalar head, Bradley–Terry loss) on preference pairs; held-out accuracy
    and calibration go to OUT/metrics.jsonl, the model to OUT/checkpoint (load it with ``reward.model=...``)."""
    try:
        cfg = rm_train_config(overrides or [])
        if cfg.out.exists():
            raise FileExistsError(f"'{cfg.out}' exists: pick a new out=FOLDER")
        from harmonyrl.rewards.pair_files import read_pairs

        loaded = read_pairs(cfg.data)  # before any compute: a bad file is one line
        console.print(loaded.summary(), highlight=False, soft_wrap=True)
        from harmonyrl.jobs.rm_train import train_reward_model

        result = train_reward_model(cfg, loaded)
    except (*USER_ERRORS, ValueError) as e:
        raise fail(str(e)) from None
    console.print(
        f"reward model: held-out accuracy [bold]{result.accuracy:.1%}[/] on {result.held_out_pairs} pairs "
        f"(ECE {result.ece:.3f}; trained on {result.train_pairs})  → {result.checkpoint}"
    )


@rm_app.command("pairs")
def pairs_cmd(
    checkpoint: Annotated[Path, typer.Option("--checkpoint", help="Policy checkpoint that samples the answers.")],
    out: Annotated[Path, typer.Option("--out", help="JSONL file to write (TRL prompt/chosen/rejected rows).")],
    prompts: Annotated[int, typer.Option("--prompts", min=1, help="Training tasks to sample two answers for.")] = 500,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML run config.")] = None,
    overrides: Annotated[list[str] | None, typer.Argument(help="Run overrides, e.g. env.name=instruct")] = None,
) -> None:
    """Preference pairs from the env's code checkers: two sampled answers per training task, ranked by constraints
    met (instruct) or reward; ties dropped and counted. Default env: instruct."""
    given = overrides or []
    if not any(o.strip().startswith("env.name=") for o in given):
        given = ["env.name=instruct", *given]
    try:
        cfg = load_config(config, given)
        from harmonyrl.jobs.rm_pairs import generate_pairs

        stats = asyncio.run(generate_pairs(cfg, checkpoint, prompts, out))
    except USER_ERRORS as e:
        raise fail(str(e)) from None
    console.print(stats.line(out), highlight=False)
