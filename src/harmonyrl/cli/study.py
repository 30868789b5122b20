"""``harmonyrl plan``, ``presets``, ``compare`` and ``sweep``: what a run will cost, the named presets, algorithms
side by side, and a search over config values."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Literal

import typer

from harmonyrl.cli.common import (
    USER_ERRORS,
    ConfigOpt,
    OverridesArg,
    PresetOpt,
    config_of,
    console,
    fail,
    one_process,
    preset_file,
    print_presets,
)
from harmonyrl.config import ConfigError


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
    from harmonyrl.cli.plan import print_plan

    cfg = config_of(config, overrides, preset_file(preset))
    print_plan(cfg, model, hardware, calibrate, price, tool_latency_s, gen_tokens, json_out)


def presets() -> None:
    """List the named presets (-p NAME) with a one-line description each (docs/sweeps.md says how each was chosen)."""
    print_presets()


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
    one_process("compare")
    cfg = config_of(config, overrides)
    from harmonyrl.jobs.compare import compare, parse_algos

    try:
        names = parse_algos(algos)
        asyncio.run(compare(cfg, names, seeds, target, out, console))
    except ConfigError as e:
        raise fail(str(e)) from None
    except USER_ERRORS as e:
        raise fail(str(e)) from None
    console.print(f"comparison: [bold]{out / 'compare.md'}[/]  plot: [bold]{out / 'compare.png'}[/]")


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
    one_process("sweep")
    from harmonyrl.run.folder import default_run_name
    from harmonyrl.sweep import command
    from harmonyrl.sweep.space import SpaceError
    from harmonyrl.sweep.study import SweepError

    try:
        if resume is None:
            folder = out or Path("runs") / f"sweep-{default_run_name()}"
            options = (config, overrides or [], param or [], space, trials, jobs, seed or 0, prune is not False)
            command.start(console, folder, *options, preset=preset_file(preset), split=split or "validation")
        elif any(x not in (None, []) for x in (config, overrides, param, space, out, seed, prune, preset, split)):
            raise SweepError("--resume continues the folder's own search: give only --trials and --jobs with it")
        else:
            command.resume(console, resume, trials, jobs)
    except (ConfigError, SpaceError, SweepError) as e:
        raise fail(str(e)) from None


def register(app: typer.Typer) -> None:
    """Add ``plan``, ``presets``, ``compare`` and ``sweep`` to ``app``."""
    app.command()(plan)
    app.command()(presets)
    app.command(name="compare")(compare_cmd)
    app.command(name="sweep")(sweep_cmd)
