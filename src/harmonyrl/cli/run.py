"""``harmonyrl train``, ``sft`` and ``eval``: a run, its warm start alone, and a checkpoint's evaluation. Heavy imports
(torch, transformers) happen inside the commands so that ``--help`` and config errors are instant."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer

from harmonyrl.cli.common import (
    USER_ERRORS,
    ConfigOpt,
    OverridesArg,
    OverwriteOpt,
    PresetOpt,
    ResumeOpt,
    config_of,
    console,
    fail,
    interrupted,
    one_process,
    preset_file,
    run_failed,
)
from harmonyrl.config import ConfigError, RunConfig, load_config

if TYPE_CHECKING:  # torch behind it: imported inside the command
    from harmonyrl.distributed.world import World


def _run_config(
    config: Path | None, overrides: list[str] | None, resume: Path | None, overwrite: bool, preset: str | None = None
) -> RunConfig:
    """The config of a run: the resumed run's own ``config.yaml``, else the given one with the run name fixed
    now (so that a run that fails before its first step can be cleaned up by name)."""
    from harmonyrl.run.folder import default_run_name

    if resume is None:
        file = preset_file(preset)
        named = [*(overrides or []), *([f"preset={preset}"] if file is not None else [])]  # recorded in config.yaml
        cfg = config_of(config, named, file)
        return cfg if cfg.run_name else config_of(config, [*named, f"run_name={default_run_name()}"], file)
    if config is not None or overrides or overwrite or preset is not None:
        raise fail("--resume takes the run's own config.yaml; do not pass --config, overrides or --overwrite (or -p)")
    if not (resume / "config.yaml").is_file():
        raise fail(f"cannot resume '{resume}': it is not a run folder (no config.yaml)")
    return config_of(resume / "config.yaml", [f"output_dir={resume.parent}", f"run_name={resume.name}"])


def train(
    config: ConfigOpt = None,
    overrides: OverridesArg = None,
    resume: ResumeOpt = None,
    overwrite: OverwriteOpt = False,
    preset: PresetOpt = None,
) -> None:
    """SFT warm start, then RL on the environment, with held-out evaluation before and after.

    Under ``torchrun --nproc_per_node N -m harmonyrl.cli train ...`` the learner is sharded over the N processes
    (FSDP2, docs/distributed.md): rank 0 rolls out, evaluates and writes; the others only train."""
    from harmonyrl.distributed.world import LaunchError, broadcast, join, leave

    try:
        world = join()  # a torchrun launch starts its process group here; else the single process
    except LaunchError as e:
        raise fail(str(e)) from None
    console.quiet = not world.is_main  # rank 0 alone talks; the others fail as it does, silently
    try:
        cfg = broadcast(_run_config(config, overrides, resume, overwrite, preset), world)  # rank 0's default run name
        from harmonyrl.rl.learner import check_distributable

        try:
            check_distributable(cfg.rl, world)
        except ValueError as e:
            raise fail(str(e)) from None
        _train(cfg, resume is not None, overwrite, world)
    except BaseException:
        leave(world, clean=False)
        raise
    leave(world)


def _train(cfg: RunConfig, resume: bool, overwrite: bool, world: World) -> None:
    """``train`` once its config is fixed: the run, with its failures turned into one line."""
    from contextlib import nullcontext

    from harmonyrl.cli.plan import check_plan, resident_bytes
    from harmonyrl.jobs.train import train as run_train
    from harmonyrl.rl.fault_breaker import FaultBreakerTripped
    from harmonyrl.run.failure import EngineStopped, RunFolderError
    from harmonyrl.run.folder import discard_if_unstarted
    from harmonyrl.run.ranks import RankZeroStopped

    run_dir = cfg.output_dir / str(cfg.run_name)
    resident = resident_bytes("VmRSS", reset_peak=True)
    try:
        with discard_if_unstarted(run_dir) if world.is_main else nullcontext():  # the folder is rank 0's
            asyncio.run(run_train(cfg, console, resume=resume, overwrite=overwrite, world=world))
    except RankZeroStopped:
        raise typer.Exit(code=2) from None
    except USER_ERRORS as e:
        raise fail(str(e)) from None
    except (RunFolderError, EngineStopped, FaultBreakerTripped) as e:
        raise fail(str(e), code=1) from None
    except KeyboardInterrupt:
        raise interrupted(run_dir, "train") from None
    except Exception as e:
        raise run_failed(e) from None
    if world.is_main and (run_dir / "summary.json").is_file():
        check_plan(cfg, run_dir, resident)


ExportOpt = Annotated[
    Path | None,
    typer.Option(
        "--export-demos",
        help="Write the scripted expert's demonstrations to this JSONL file (the sft.demos schema) and stop.",
    ),
]


def sft(
    config: ConfigOpt = None,
    overrides: OverridesArg = None,
    resume: ResumeOpt = None,
    overwrite: OverwriteOpt = False,
    export_demos: ExportOpt = None,
    preset: PresetOpt = None,
) -> None:
    """Supervised warm start only; writes RUN/checkpoints/sft for `train model.init_from=...`."""
    one_process("sft")
    if export_demos is not None:
        return _export_demos(config_of(config, overrides, preset_file(preset)), export_demos)
    cfg = _run_config(config, overrides, resume, overwrite, preset)
    from harmonyrl.jobs.train import sft_only
    from harmonyrl.run.failure import RunFolderError
    from harmonyrl.run.folder import discard_if_unstarted

    run_dir = cfg.output_dir / str(cfg.run_name)
    try:
        with discard_if_unstarted(run_dir):
            path = asyncio.run(sft_only(cfg, console, resume=resume is not None, overwrite=overwrite))
    except USER_ERRORS as e:
        raise fail(str(e)) from None
    except RunFolderError as e:
        raise fail(str(e), code=1) from None
    except KeyboardInterrupt:
        raise interrupted(run_dir, "sft") from None
    except Exception as e:
        raise run_failed(e) from None
    console.print(f"SFT checkpoint: [bold]{path}[/]")


def _export_demos(cfg: RunConfig, path: Path) -> None:
    from harmonyrl.jobs.export_demos import export_expert_demos

    try:
        n = asyncio.run(export_expert_demos(cfg, path))
    except USER_ERRORS as e:
        raise fail(str(e)) from None
    console.print(f"wrote {n} demonstrations of env {cfg.env.name} to {path}: train on them with sft.demos={path}")


def _eval_config(config: Path | None, overrides: list[str], checkpoint: Path, preset: Path | None) -> RunConfig:
    """The config of ``eval``. ``env.*`` overrides that are not a whole env on their own (``env.kwargs.x=1`` of a
    custom env, whose ``env.factory`` is in the record) are checked later, on top of the checkpoint's record."""
    try:
        return load_config(config, overrides, [] if preset is None else [preset])
    except ConfigError as e:
        from harmonyrl.run.checkpoint_files import record_path

        others = [o for o in overrides if not o.strip().startswith("env.")]
        if len(others) == len(overrides) or record_path(checkpoint) is None:
            raise fail(str(e)) from None
        return config_of(config, others, preset)


def evaluate(
    checkpoint: Annotated[Path, typer.Option("--checkpoint", help="Checkpoint folder (config.json + safetensors).")],
    config: ConfigOpt = None,
    overrides: OverridesArg = None,
    allow_env_mismatch: Annotated[
        bool, typer.Option("--allow-env-mismatch", help="Evaluate on env.* settings other than the checkpoint's.")
    ] = False,
    preset: PresetOpt = None,
    split: Annotated[
        Literal["validation", "test"] | None,
        typer.Option(help="validation: where settings are chosen; test: the figure to report (default: eval.split)."),
    ] = None,
    metrics_out: Annotated[
        Path | None,
        typer.Option("--metrics-out", help="Also write the metrics, split and checkpoint as JSON to this file."),
    ] = None,
) -> None:
    """Evaluate a checkpoint on the held-out split of the env it was trained on (recorded in the checkpoint);
    prints a table and the metrics as JSON (``--metrics-out``: into a file too, for scripts)."""
    from harmonyrl.config import merge_trees
    from harmonyrl.run.eval_env import explicit_env, resolve_eval_env

    overrides = [*(overrides or []), *([f"eval.split={split}"] if split else [])]  # eval.split's default: test
    file = preset_file(preset)
    try:
        chosen = resolve_eval_env(
            _eval_config(config, overrides or [], checkpoint, file),
            checkpoint,
            merge_trees(explicit_env(file, []), explicit_env(config, overrides or [])),
            allow_env_mismatch,
        )
    except ConfigError as e:
        raise fail(str(e)) from None
    except USER_ERRORS as e:
        raise fail(str(e)) from None
    cfg = chosen.config
    if metrics_out is not None and not metrics_out.parent.is_dir():
        raise fail(f"--metrics-out {metrics_out}: its folder does not exist")
    from harmonyrl.jobs.train import eval_only

    try:
        metrics = asyncio.run(eval_only(cfg, checkpoint, console, announce=chosen.message_for))
    except USER_ERRORS as e:
        raise fail(str(e)) from None
    import json

    from rich.table import Table

    table = Table(title=f"held-out evaluation of {checkpoint} ({cfg.eval.split} split)")
    for col in ("metric", f"sampled (T={cfg.eval.temperature:g})", "greedy"):
        table.add_column(col, justify="right")
    for name in sorted({k.split("/", 1)[1] for k in metrics if k.startswith(("eval/", "eval_greedy/"))}):
        cells = [metrics.get(f"{side}/{name}") for side in ("eval", "eval_greedy")]
        table.add_row(name, *("" if v is None else f"{v:.4g}" for v in cells))
    console.print(table)
    for side, prefix in (("sampled", "eval/failure_"), ("greedy", "eval_greedy/failure_")):
        failures = {k.removeprefix(prefix): v for k, v in sorted(metrics.items()) if k.startswith(prefix)}
        if failures:  # masked, not counted as misses: by class, so a user sees which fault it was
            shown = ", ".join(f"{kind}={n:g}" for kind, n in failures.items())
            console.print(f"environment failures ({side}, left out of the scores): {shown}", highlight=False)
    console.print_json(json.dumps(metrics))
    if metrics_out is not None:
        record = {"checkpoint": str(checkpoint), "split": cfg.eval.split, "metrics": metrics}
        metrics_out.write_text(json.dumps(record, indent=1) + "\n")


def register(app: typer.Typer) -> None:
    """Add ``train``, ``sft`` and ``eval`` to ``app``."""
    app.command()(train)
    app.command()(sft)
    app.command(name="eval")(evaluate)
