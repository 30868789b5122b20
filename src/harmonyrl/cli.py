"""The ``harmonyrl`` command. Heavy imports (torch, transformers) happen inside the commands so that
``--help`` and config errors are instant. User mistakes end in a one-line error, never a traceback."""

from __future__ import annotations

import asyncio
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer
from rich.markup import escape

from harmonyrl.cli_common import HELP_CONTEXT, HELP_MARKUP, USER_ERRORS, console, fail
from harmonyrl.cli_gate import register as register_gate
from harmonyrl.cli_inspect import register as register_inspect
from harmonyrl.cli_rm import rm_app
from harmonyrl.config import ConfigError, RunConfig, load_config

if TYPE_CHECKING:  # torch behind it: imported inside the command
    from harmonyrl.distributed.world import World

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Agentic RL for GPT-OSS-style models.",
    rich_markup_mode=HELP_MARKUP,
    context_settings=HELP_CONTEXT,
)

ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="YAML config file.")]
PresetOpt = Annotated[
    str | None,
    typer.Option("--preset", "-p", help="Named preset, applied before -c and the overrides ('list': list them)."),
]
OverridesArg = Annotated[
    list[str] | None, typer.Argument(help="Dotted overrides, e.g. rl.steps=10 rollout.group_size=4")
]


def _run_failed(e: Exception) -> typer.Exit:
    """A run that stopped on an exception that is not the user's: one line, the traceback in the run folder's
    ``error.log`` (named by a note on the exception) or, when there is none, on stderr."""
    from harmonyrl.trainer.run_errors import TRACEBACK_NOTE, is_storage_error, storage_message

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


def _interrupted(run_dir: Path, command: str) -> typer.Exit:
    """Ctrl-C: one line saying where the run got to and how to continue it (exit 130, the shell's for SIGINT).
    The folder is left as a kill would leave it: every completed step is checkpointed atomically."""
    from harmonyrl.trainer.run_folder import interrupted_message

    console.print(f"[yellow]{escape(interrupted_message(run_dir, command))}[/]", highlight=False, soft_wrap=True)
    return typer.Exit(code=130)


def _config(config: Path | None, overrides: list[str] | None, preset: Path | None = None) -> RunConfig:
    try:
        return load_config(config, overrides or [], [] if preset is None else [preset])
    except ConfigError as e:
        raise fail(str(e)) from None


def _print_presets() -> None:
    from harmonyrl import preset_files

    for p in preset_files.available():
        console.print(f"{p.name:<12} {p.description}", highlight=False, soft_wrap=True, markup=False)
    for p in preset_files.available(preset_files.algorithms_folder()):  # compare --algos NAME, not -p NAME
        console.print(f"{p.name:<12} (compare --algos) {p.description}", highlight=False, soft_wrap=True, markup=False)
    folder = preset_files.PRESETS_DIR
    console.print(f"(YAML files in {folder}; use one with -p NAME)", highlight=False, soft_wrap=True, markup=False)


def _preset(name: str | None) -> Path | None:
    """The file of preset ``name``; ``list`` prints the presets and exits."""
    if name is None:
        return None
    if name == "list":
        _print_presets()
        raise typer.Exit(0)
    from harmonyrl.preset_files import PresetError, find

    try:
        return find(name)
    except PresetError as e:
        raise fail(str(e)) from None


@app.command()
def plan(
    overrides: OverridesArg = None,
    config: ConfigOpt = None,
    preset: PresetOpt = None,
    model: Annotated[
        str | None,
        typer.Option(help="gpt-oss-20b, gpt-oss-120b, a preset, or a folder with config.json (default: the run's)."),
    ] = None,
    hardware: Annotated[str, typer.Option(help="h100, h200, b200, a100, l40s or cpu (docs/plan.md).")] = "h200",
    calibrate: Annotated[bool, typer.Option("--calibrate", help="Measure this machine instead of --hardware.")] = False,
    price: Annotated[str | None, typer.Option(help="Price of one device-hour, for the cost (a number).")] = None,
    tool_latency_s: Annotated[
        float, typer.Option(min=0, help="Seconds one tool call takes (episode critical path).")
    ] = 0.0,
    gen_tokens: Annotated[
        int | None, typer.Option(min=1, help="Tokens an episode generates (default: the config's bound).")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
) -> None:
    """What the run that the config describes needs and costs: memory per device by component, the smallest layout
    that fits, throughput bounds, step time, hours and device-hours for rl.steps (docs/plan.md)."""
    from harmonyrl.cli_plan import print_plan

    cfg = _config(config, overrides, _preset(preset))
    print_plan(cfg, model, hardware, calibrate, price, tool_latency_s, gen_tokens, json_out)


@app.command()
def presets() -> None:
    """List the named presets (-p NAME) with a one-line description each (docs/sweeps.md says how each was chosen)."""
    _print_presets()


def _one_process(command: str) -> None:
    """Refuse a torchrun launch of a command that runs in one process (its N copies would write one folder)."""
    from harmonyrl.distributed.world import LaunchError, launched_size

    try:
        size = launched_size()
    except LaunchError as e:
        raise fail(str(e)) from None
    if size > 1:
        raise fail(f"harmonyrl {command} runs in one process; under torchrun only `harmonyrl train` is sharded")


ResumeOpt = Annotated[Path | None, typer.Option("--resume", help="Continue this run folder from its last checkpoint.")]
OverwriteOpt = Annotated[
    bool, typer.Option("--overwrite", help="Replace an earlier run folder of the same name (deletes it).")
]


def _run_config(
    config: Path | None, overrides: list[str] | None, resume: Path | None, overwrite: bool, preset: str | None = None
) -> RunConfig:
    """The config of a run: the resumed run's own ``config.yaml``, else the given one with the run name fixed
    now (so that a run that fails before its first step can be cleaned up by name)."""
    from harmonyrl.trainer.run_folder import default_run_name

    if resume is None:
        file = _preset(preset)
        named = [*(overrides or []), *([f"preset={preset}"] if file is not None else [])]  # recorded in config.yaml
        cfg = _config(config, named, file)
        return cfg if cfg.run_name else _config(config, [*named, f"run_name={default_run_name()}"], file)
    if config is not None or overrides or overwrite or preset is not None:
        raise fail("--resume takes the run's own config.yaml; do not pass --config, overrides or --overwrite (or -p)")
    if not (resume / "config.yaml").is_file():
        raise fail(f"cannot resume '{resume}': it is not a run folder (no config.yaml)")
    return _config(resume / "config.yaml", [f"output_dir={resume.parent}", f"run_name={resume.name}"])


@app.command()
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
        from harmonyrl.trainer.learner import check_distributable

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

    from harmonyrl.cli_plan import check_plan, resident_bytes
    from harmonyrl.trainer.fault_breaker import FaultBreakerTripped
    from harmonyrl.trainer.loop import train as run_train
    from harmonyrl.trainer.ranks import RankZeroStopped
    from harmonyrl.trainer.run_errors import EngineStopped, RunFolderError
    from harmonyrl.trainer.run_folder import discard_if_unstarted

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
        raise _interrupted(run_dir, "train") from None
    except Exception as e:
        raise _run_failed(e) from None
    if world.is_main and (run_dir / "summary.json").is_file():
        check_plan(cfg, run_dir, resident)


ExportOpt = Annotated[
    Path | None,
    typer.Option(
        "--export-demos",
        help="Write the scripted expert's demonstrations to this JSONL file (the sft.demos schema) and stop.",
    ),
]


@app.command()
def sft(
    config: ConfigOpt = None,
    overrides: OverridesArg = None,
    resume: ResumeOpt = None,
    overwrite: OverwriteOpt = False,
    export_demos: ExportOpt = None,
    preset: PresetOpt = None,
) -> None:
    """Supervised warm start only; writes RUN/checkpoints/sft for `train model.init_from=...`."""
    _one_process("sft")
    if export_demos is not None:
        return _export_demos(_config(config, overrides, _preset(preset)), export_demos)
    cfg = _run_config(config, overrides, resume, overwrite, preset)
    from harmonyrl.trainer.loop import sft_only
    from harmonyrl.trainer.run_errors import RunFolderError
    from harmonyrl.trainer.run_folder import discard_if_unstarted

    run_dir = cfg.output_dir / str(cfg.run_name)
    try:
        with discard_if_unstarted(run_dir):
            path = asyncio.run(sft_only(cfg, console, resume=resume is not None, overwrite=overwrite))
    except USER_ERRORS as e:
        raise fail(str(e)) from None
    except RunFolderError as e:
        raise fail(str(e), code=1) from None
    except KeyboardInterrupt:
        raise _interrupted(run_dir, "sft") from None
    except Exception as e:
        raise _run_failed(e) from None
    console.print(f"SFT checkpoint: [bold]{path}[/]")


def _export_demos(cfg: RunConfig, path: Path) -> None:
    from harmonyrl.trainer.demos_export import export_expert_demos

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
        from harmonyrl.trainer.checkpoint_files import record_path

        others = [o for o in overrides if not o.strip().startswith("env.")]
        if len(others) == len(overrides) or record_path(checkpoint) is None:
            raise fail(str(e)) from None
        return _config(config, others, preset)


@app.command(name="eval")
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
) -> None:
    """Evaluate a checkpoint on the held-out split of the env it was trained on (recorded in the checkpoint);
    prints a table and the metrics as JSON."""
    from harmonyrl.config import merge_trees
    from harmonyrl.trainer.eval_env import explicit_env, resolve_eval_env

    overrides = [*(overrides or []), *([f"eval.split={split}"] if split else [])]  # eval.split's default: test
    file = _preset(preset)
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
    from harmonyrl.trainer.loop import eval_only

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


@app.command(name="compare")
def compare_cmd(
    algos: Annotated[
        str, typer.Option(help="Comma-separated: ppo, grpo, dr_grpo, rloo, reinforce_pp, gspo, a2c, sac.")
    ] = ("ppo,grpo,rloo,reinforce_pp,gspo,sac"),
    seeds: Annotated[int, typer.Option(min=1, help="Seeds per algorithm (each seed: one shared SFT warm start).")] = 1,
    target: Annotated[float, typer.Option(min=0.0, max=1.0, help="Held-out pass@1 that counts as reached.")] = 0.5,
    out: Annotated[Path, typer.Option(help="Folder for the runs, compare.md/.json/.png (must be new).")] = Path(
        "runs/compare"
    ),
    config: ConfigOpt = None,
    overrides: OverridesArg = None,
) -> None:
    """Run several RL algorithms on the same env, model, seeds and sample budget; write a table and a plot."""
    _one_process("compare")
    cfg = _config(config, overrides)
    from harmonyrl.trainer.compare import compare, parse_algos

    try:
        names = parse_algos(algos)
        asyncio.run(compare(cfg, names, seeds, target, out, console))
    except ConfigError as e:
        raise fail(str(e)) from None
    except USER_ERRORS as e:
        raise fail(str(e)) from None
    console.print(f"comparison: [bold]{out / 'compare.md'}[/]  plot: [bold]{out / 'compare.png'}[/]")


@app.command(name="sweep")
def sweep_cmd(
    param: Annotated[
        list[str] | None,
        typer.Option("--param", help="KEY=float:LOW:HIGH[:STEP] | log:LOW:HIGH | int:LOW:HIGH[:STEP] | choice:A,B"),
    ] = None,
    space: Annotated[Path | None, typer.Option("--space", help="YAML search space: {dotted.key: SPEC}.")] = None,
    trials: Annotated[int, typer.Option(min=1, help="Trials in all (a resumed sweep counts its earlier ones).")] = 20,
    jobs: Annotated[int, typer.Option(min=1, help="Trials run at once, each in its own process.")] = 1,
    out: Annotated[Path | None, typer.Option(help="New sweep folder (default: runs/sweep-<time>).")] = None,
    resume: Annotated[Path | None, typer.Option("--resume", help="Continue this sweep folder's study.")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed of the TPE sampler (default 0).")] = None,
    prune: Annotated[
        bool | None, typer.Option(help="Stop trials whose periodic held-out pass@1 trails (median; default on).")
    ] = None,
    split: Annotated[
        Literal["validation", "test"] | None,
        typer.Option(help="Split the trials are evaluated on (default validation: test is for the chosen config)."),
    ] = None,
    config: ConfigOpt = None,
    overrides: OverridesArg = None,
    preset: PresetOpt = None,
) -> None:
    """Search config values with Optuna (TPE, median pruning): each trial a `harmonyrl train` process; writes
    best_config.yaml, trials.csv and trials.png to the sweep folder (docs/sweeps.md)."""
    _one_process("sweep")
    from harmonyrl.sweep import command
    from harmonyrl.sweep.space import SpaceError
    from harmonyrl.sweep.study import SweepError
    from harmonyrl.trainer.run_folder import default_run_name

    try:
        if resume is None:
            folder = out or Path("runs") / f"sweep-{default_run_name()}"
            options = (config, overrides or [], param or [], space, trials, jobs, seed or 0, prune is not False)
            command.start(console, folder, *options, preset=_preset(preset), split=split or "validation")
        elif any(x not in (None, []) for x in (config, overrides, param, space, out, seed, prune, preset, split)):
            raise SweepError("--resume continues the folder's own search: give only --trials and --jobs with it")
        else:
            command.resume(console, resume, trials, jobs)
    except (ConfigError, SpaceError, SweepError) as e:
        raise fail(str(e)) from None


register_inspect(app)  # check-env, check-checkpoint, replay, show, report (cli_inspect.py)
register_gate(app)  # check-mismatch: the sampler/trainer mismatch gate (cli_gate.py)
app.add_typer(rm_app, name="rm")  # reward models: ``harmonyrl rm pairs`` / ``rm train`` (cli_rm.py)


def main() -> None:  # pragma: no cover - entry point convenience
    app()


if __name__ == "__main__":  # python -m harmonyrl.cli
    app()
