"""The ``harmonyrl`` command. Heavy imports (torch, transformers) happen inside the commands so that
``--help`` and config errors are instant. User mistakes end in a one-line error, never a traceback."""

from __future__ import annotations

import asyncio
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from harmonyrl.cli_rm import rm_app
from harmonyrl.config import ConfigError, RunConfig, load_config
from harmonyrl.envs.loader import TargetError, UserCodeError
from harmonyrl.envs.taskfile import TaskFileError, TooFewProblems
from harmonyrl.errors import (
    CheckpointError,
    ClusterError,
    DemoFileError,
    EngineUnavailable,
    KernelUnavailable,
    NoHeldOutTasks,
    NotDemonstrable,
)
from harmonyrl.sandbox.limits import SandboxUnavailable
from harmonyrl.telemetry.sinks import SinkUnavailableError

if TYPE_CHECKING:  # torch behind it: imported inside the command
    from harmonyrl.distributed.world import World

USER_ERRORS: tuple[type[Exception], ...] = (
    FileExistsError,
    FileNotFoundError,
    CheckpointError,
    KernelUnavailable,
    EngineUnavailable,
    NotDemonstrable,
    NoHeldOutTasks,
    DemoFileError,
    SinkUnavailableError,
    TaskFileError,
    TooFewProblems,
    SandboxUnavailable,
    ClusterError,
    UserCodeError,
)
"""Failures caused by the user's input or set-up (an existing run folder, a bad checkpoint, a missing optional
package, a malformed task file, more generated problems than an env's settings allow, no working bubblewrap for a
sandboxed env, the user's own env or expert code failing): one line, no traceback."""

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Agentic RL for GPT-OSS-style models.")
console = Console()

ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="YAML config file.")]
PresetOpt = Annotated[
    str | None,
    typer.Option("--preset", "-p", help="Named preset, applied before -c and the overrides ('list': list them)."),
]
OverridesArg = Annotated[
    list[str] | None, typer.Argument(help="Dotted overrides, e.g. rl.steps=10 rollout.group_size=4")
]


def _fail(message: str, code: int = 2) -> typer.Exit:
    console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True, emoji=False)
    return typer.Exit(code=code)


def _run_failed(e: Exception) -> typer.Exit:
    """A run that stopped on an exception that is not the user's: one line, the traceback in the run folder's
    ``error.log`` (named by a note on the exception) or, when there is none, on stderr."""
    from harmonyrl.trainer.run_errors import TRACEBACK_NOTE, is_storage_error, storage_message

    if isinstance(e, OSError) and is_storage_error(e):  # before the run folder existed: nothing was kept
        return _fail(storage_message(e, None))
    notes = [n for n in getattr(e, "__notes__", []) if n.startswith(TRACEBACK_NOTE)]
    if notes:
        where = notes[0]
    else:
        traceback.print_exception(e, file=sys.stderr)
        where = "traceback on stderr"
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    cause = f"{type(e).__name__}: {text}" if text else type(e).__name__
    return _fail(f"the run stopped on an unexpected error: {cause} ({where})", code=1)


def _config(config: Path | None, overrides: list[str] | None, preset: Path | None = None) -> RunConfig:
    try:
        return load_config(config, overrides or [], [] if preset is None else [preset])
    except ConfigError as e:
        raise _fail(str(e)) from None


def _print_presets() -> None:
    from harmonyrl import preset_files

    for p in preset_files.available():
        console.print(f"{p.name:<12} {p.description}", highlight=False, soft_wrap=True, markup=False)
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
        raise _fail(str(e)) from None


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
        raise _fail(str(e)) from None
    if size > 1:
        raise _fail(f"harmonyrl {command} runs in one process; under torchrun only `harmonyrl train` is sharded")


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
        cfg = _config(config, overrides, file)
        return cfg if cfg.run_name else _config(config, [*(overrides or []), f"run_name={default_run_name()}"], file)
    if config is not None or overrides or overwrite or preset is not None:
        raise _fail("--resume takes the run's own config.yaml; do not pass --config, overrides or --overwrite (or -p)")
    if not (resume / "config.yaml").is_file():
        raise _fail(f"cannot resume '{resume}': it is not a run folder (no config.yaml)")
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
        raise _fail(str(e)) from None
    console.quiet = not world.is_main  # rank 0 alone talks; the others fail as it does, silently
    try:
        cfg = broadcast(_run_config(config, overrides, resume, overwrite, preset), world)  # rank 0's default run name
        from harmonyrl.trainer.learner import check_distributable

        try:
            check_distributable(cfg.rl, world)
        except ValueError as e:
            raise _fail(str(e)) from None
        _train(cfg, resume is not None, overwrite, world)
    finally:
        leave(world)


def _train(cfg: RunConfig, resume: bool, overwrite: bool, world: World) -> None:
    """``train`` once its config is fixed: the run, with its failures turned into one line."""
    from contextlib import nullcontext

    from harmonyrl.trainer.fault_breaker import FaultBreakerTripped
    from harmonyrl.trainer.loop import train as run_train
    from harmonyrl.trainer.ranks import RankZeroStopped
    from harmonyrl.trainer.run_errors import RunFolderError
    from harmonyrl.trainer.run_folder import discard_if_unstarted

    run_dir = cfg.output_dir / str(cfg.run_name)
    try:
        with discard_if_unstarted(run_dir) if world.is_main else nullcontext():  # the folder is rank 0's
            asyncio.run(run_train(cfg, console, resume=resume, overwrite=overwrite, world=world))
    except RankZeroStopped:
        raise typer.Exit(code=2) from None
    except USER_ERRORS as e:
        raise _fail(str(e)) from None
    except (RunFolderError, FaultBreakerTripped) as e:
        raise _fail(str(e), code=1) from None
    except Exception as e:
        raise _run_failed(e) from None


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

    try:
        with discard_if_unstarted(cfg.output_dir / str(cfg.run_name)):
            path = asyncio.run(sft_only(cfg, console, resume=resume is not None, overwrite=overwrite))
    except USER_ERRORS as e:
        raise _fail(str(e)) from None
    except RunFolderError as e:
        raise _fail(str(e), code=1) from None
    except Exception as e:
        raise _run_failed(e) from None
    console.print(f"SFT checkpoint: [bold]{path}[/]")


def _export_demos(cfg: RunConfig, path: Path) -> None:
    from harmonyrl.trainer.demos_export import export_expert_demos

    try:
        n = asyncio.run(export_expert_demos(cfg, path))
    except USER_ERRORS as e:
        raise _fail(str(e)) from None
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
            raise _fail(str(e)) from None
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
) -> None:
    """Evaluate a checkpoint on the held-out split of the env it was trained on (recorded in the checkpoint);
    prints a table and the metrics as JSON."""
    from harmonyrl.config import merge_trees
    from harmonyrl.trainer.eval_env import explicit_env, resolve_eval_env

    file = _preset(preset)
    try:
        chosen = resolve_eval_env(
            _eval_config(config, overrides or [], checkpoint, file),
            checkpoint,
            merge_trees(explicit_env(file, []), explicit_env(config, overrides or [])),
            allow_env_mismatch,
        )
    except ConfigError as e:
        raise _fail(str(e)) from None
    except USER_ERRORS as e:
        raise _fail(str(e)) from None
    cfg = chosen.config
    from harmonyrl.trainer.loop import eval_only

    try:
        metrics = asyncio.run(eval_only(cfg, checkpoint, console, announce=chosen.message))
    except USER_ERRORS as e:
        raise _fail(str(e)) from None
    import json

    from rich.table import Table

    table = Table(title=f"held-out evaluation of {checkpoint}")
    for col in ("metric", f"sampled (T={cfg.eval.temperature:g})", "greedy"):
        table.add_column(col, justify="right")
    for name in sorted({k.split("/", 1)[1] for k in metrics if k.startswith(("eval/", "eval_greedy/"))}):
        cells = [metrics.get(f"{side}/{name}") for side in ("eval", "eval_greedy")]
        table.add_row(name, *("" if v is None else f"{v:.4g}" for v in cells))
    console.print(table)
    failures = {k: v for k, v in metrics.items() if k.startswith("env/")}
    if failures:
        console.print("environment failures: " + ", ".join(f"{k[4:]}={v:g}" for k, v in failures.items()))
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
        raise _fail(str(e)) from None
    except USER_ERRORS as e:
        raise _fail(str(e)) from None
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
            command.start(console, folder, *options, preset=_preset(preset))
        elif any(x not in (None, []) for x in (config, overrides, param, space, out, seed, prune, preset)):
            raise SweepError("--resume continues the folder's own search: give only --trials and --jobs with it")
        else:
            command.resume(console, resume, trials, jobs)
    except (ConfigError, SpaceError, SweepError) as e:
        raise _fail(str(e)) from None


@app.command(name="check-env")
def check_env_cmd(
    target: Annotated[
        str, typer.Argument(help="MODULE:FACTORY or path/to/file.py:FACTORY (a zero-argument callable).")
    ],
    tasks: Annotated[int, typer.Option(min=1, help="Tasks to drive scripted episodes through.")] = 5,
) -> None:
    """Check a user environment against the contract the rollout layer relies on; exit 1 on any error
    (warnings, e.g. a tool without a description, are shown but do not fail it)."""
    from rich.markup import escape

    from harmonyrl.envs.checker import check_target, errors

    try:
        issues = check_target(target, n_tasks=tasks)
    except TargetError as e:
        raise _fail(f"{target}: {e}") from None
    for issue in issues:
        mark = "[red]✗[/]" if issue.severity == "error" else "[yellow]![/]"
        console.print(f"{mark} {escape(str(issue))}", highlight=False, soft_wrap=True)
    if errors(issues):
        raise typer.Exit(code=1)
    warned = len(issues)
    note = f", {warned} warning{'s' * (warned > 1)}" if warned else ""
    console.print(f"[green]✓[/] {escape(target)}: environment contract OK ({tasks} tasks{note})", soft_wrap=True)


@app.command(name="check-checkpoint")
def check_checkpoint_cmd(
    folder: Annotated[Path, typer.Argument(help="A gpt-oss checkpoint folder (config.json, index and/or shards).")],
    show: Annotated[int, typer.Option(min=1, help="Names to list per kind of problem.")] = 20,
) -> None:
    """Build the model skeleton from FOLDER/config.json without allocating weights and check its parameter names
    and shapes against the safetensors index and shard headers (MXFP4 experts understood); exit 1 on mismatch."""
    from harmonyrl.models.real import check_checkpoint

    try:
        rep = check_checkpoint(folder)
    except CheckpointError as e:
        raise _fail(str(e)) from None
    c = rep.config
    console.print(
        f"{folder}: gpt-oss, {c.num_hidden_layers} layers, {c.num_local_experts} experts top-{c.num_experts_per_tok}, "
        f"{c.num_attention_heads} heads / {c.num_key_value_heads} KV heads × {c.head_dim}, hidden {c.hidden_size}, "
        f"vocab {c.vocab_size} — {rep.num_parameters:,} parameters ({rep.num_parameters / 1e9:.2f} B)",
        highlight=False,
        soft_wrap=True,
    )
    if not rep.tensors_named:
        console.print("[yellow]no model.safetensors.index.json or model.safetensors: nothing to compare[/]")
        return
    console.print(
        f"checkpoint: {rep.tensors_named} tensors named, {rep.shapes_checked} shapes checked, "
        f"{len(rep.quantised)} expert matrices stored as MXFP4",
        highlight=False,
        soft_wrap=True,
    )
    if rep.absent_shards:
        absent = ", ".join(rep.absent_shards)
        console.print(f"[yellow]shard files not present (shapes unchecked):[/] {absent}", soft_wrap=True)
    problems = [
        ("missing", list(rep.missing)),
        ("unexpected", list(rep.unexpected)),
        ("wrong shape", [f"{m.name}: expected {list(m.expected)}, got {list(m.found)}" for m in rep.shape_mismatches]),
    ]
    for kind, lines in problems:
        for line in lines[:show]:
            console.print(f"[red]✗ {kind}[/] {line}", highlight=False, soft_wrap=True)
        if len(lines) > show:
            console.print(f"[red]✗ {kind}[/] … and {len(lines) - show} more", highlight=False)
    if not rep.ok:
        raise typer.Exit(code=1)
    console.print("[green]✓[/] every parameter is in the checkpoint with the right shape, and nothing else is")


@app.command()
def replay(
    run_dir: Annotated[Path, typer.Argument(help="A run folder with recorded rollouts (rollouts/step_*.parquet).")],
    step: Annotated[int, typer.Option(min=1, help="The RL step to re-run from its stored episodes.")],
    checkpoint: Annotated[Path | None, typer.Option(help="State saved at RL step N-1 (not needed for step 1).")] = None,
    save: Annotated[Path | None, typer.Option(help="Write the replayed state here (to chain replays).")] = None,
    rescore: Annotated[bool, typer.Option(help="Also re-score the stored episodes through the environment.")] = False,
) -> None:
    """Re-run one training step from stored episodes (no generation) and compare with the run's weights."""
    from harmonyrl.trainer import replay_step as rp
    from harmonyrl.trainer.run_errors import is_storage_error, storage_message

    try:
        result = rp.replay_step(run_dir, step, checkpoint, save)
        rows = rp.rescore(run_dir, step) if rescore else []
    except (ConfigError, ValueError) as e:
        raise _fail(str(e)) from None
    except USER_ERRORS as e:
        raise _fail(str(e)) from None
    except OSError as e:
        if not is_storage_error(e):
            raise
        raise _fail(storage_message(e, None)) from None
    console.print({k: round(v, 6) for k, v in sorted(result.metrics.items()) if k.startswith(("train/", "guard/"))})
    if result.identical is None:
        console.print("no checkpoint of this run is at this step: nothing to compare (use --save to chain)")
    else:
        verdict = "[green]bit-identical[/]" if result.identical else f"[red]differs[/] in {', '.join(result.differing)}"
        console.print(f"replayed step {step} vs {result.compared_with}: {verdict}")
    if rescore:
        changed = [r for r in rows if r.stored_reward != r.new_reward]
        console.print(f"re-scored {len(rows)} episodes: {len(changed)} rewards differ from the stored ones")
        for r in changed[:10]:
            console.print(f"  {r.task_id}: stored {r.stored_reward:g} → now {r.new_reward:g}")
    if result.identical is False:
        raise typer.Exit(code=1)


@app.command()
def show(
    run_dir: Annotated[Path, typer.Argument(help="A run folder with recorded rollouts.")],
    step: Annotated[int, typer.Option(min=1, help="RL step whose episodes to print.")],
    limit: Annotated[int, typer.Option(min=1, help="Episodes to print.")] = 8,
) -> None:
    """Print one step's episodes in readable harmony form: turns, channels, tool calls and results, reward."""
    from harmonyrl.rollout.show import format_episodes
    from harmonyrl.rollout.store import RolloutFileError, read_step, step_path

    try:
        trajectories = read_step(step_path(run_dir, step))
    except RolloutFileError as e:
        raise _fail(str(e)) from None
    console.print(format_episodes(trajectories, limit, step))


@app.command()
def report(
    run_dir: Annotated[Path, typer.Argument(help="A run folder (holds metrics.jsonl).")],
    episodes: Annotated[int, typer.Option(help="Sample episodes to render.")] = 8,
) -> None:
    """Write RUN_DIR/report/index.html: curves, time split and readable sample episodes, in one file."""
    from harmonyrl.telemetry.mismatch_note import mismatch_note
    from harmonyrl.telemetry.report import ReportError, load_metrics, write_report
    from harmonyrl.telemetry.series import collect_series

    try:
        path = write_report(run_dir, max_episodes=episodes)
    except ReportError as e:
        raise _fail(str(e)) from None
    if (note := mismatch_note(collect_series(load_metrics(run_dir / "metrics.jsonl")[0]))) is not None:
        console.print(f"[yellow]{note}[/]", highlight=False)
    console.print(f"report: [bold]{path}[/]")


app.add_typer(rm_app, name="rm")  # reward models: ``harmonyrl rm pairs`` / ``rm train`` (cli_rm.py)


def main() -> None:  # pragma: no cover - entry point convenience
    app()


if __name__ == "__main__":  # python -m harmonyrl.cli
    app()
