"""The ``harmonyrl`` command. Heavy imports (torch, transformers) happen inside the commands so that
``--help`` and config errors are instant. User mistakes end in a one-line error, never a traceback."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from harmonyrl.config import ConfigError, RunConfig, load_config
from harmonyrl.envs.taskfile import TaskFileError
from harmonyrl.errors import CheckpointError, KernelUnavailable, NotDemonstrable
from harmonyrl.sandbox.limits import SandboxUnavailable
from harmonyrl.telemetry.sinks import SinkUnavailableError

USER_ERRORS: tuple[type[Exception], ...] = (
    FileExistsError,
    FileNotFoundError,
    CheckpointError,
    KernelUnavailable,
    NotDemonstrable,
    SinkUnavailableError,
    TaskFileError,
    SandboxUnavailable,
)
"""Failures caused by the user's input or set-up (an existing run folder, a bad checkpoint, a missing optional
package, a malformed task file, no working bubblewrap for a sandboxed env): one line, no traceback."""

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
def train(
    config: ConfigOpt = None,
    overrides: OverridesArg = None,
    resume: Annotated[
        Path | None, typer.Option("--resume", help="Continue this run folder from its last checkpoint.")
    ] = None,
) -> None:
    """SFT warm start, then RL on the environment, with held-out evaluation before and after."""
    if resume is not None:
        if config is not None or overrides:
            raise _fail("--resume takes the run's own config.yaml; do not pass --config or overrides")
        if not (resume / "config.yaml").is_file():
            raise _fail(f"cannot resume '{resume}': it is not a run folder (no config.yaml)")
        cfg = _config(resume / "config.yaml", [f"output_dir={resume.parent}", f"run_name={resume.name}"])
    else:
        cfg = _config(config, overrides)
    from harmonyrl.trainer.loop import train as run_train

    try:
        asyncio.run(run_train(cfg, console, resume=resume is not None))
    except USER_ERRORS as e:
        raise _fail(str(e)) from None


@app.command()
def sft(config: ConfigOpt = None, overrides: OverridesArg = None) -> None:
    """Supervised warm start only; writes RUN/checkpoints/sft for `train model.init_from=...`."""
    cfg = _config(config, overrides)
    from harmonyrl.trainer.loop import sft_only

    try:
        path = asyncio.run(sft_only(cfg, console))
    except USER_ERRORS as e:
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


@app.command(name="check-env")
def check_env_cmd(
    target: Annotated[
        str, typer.Argument(help="MODULE:FACTORY or path/to/file.py:FACTORY (a zero-argument callable).")
    ],
    tasks: Annotated[int, typer.Option(min=1, help="Tasks to drive scripted episodes through.")] = 5,
) -> None:
    """Check a user environment against the contract the rollout layer relies on; exit 1 on any issue."""
    from harmonyrl.envs.checker import check_env, load_factory

    try:
        make = load_factory(target)
        issues = check_env(make(), n_tasks=tasks, rebuild=make)
    except (ValueError, ImportError) as e:
        raise _fail(str(e)) from None
    for issue in issues:
        console.print(f"[red]✗[/] {issue}", highlight=False)
    if issues:
        raise typer.Exit(code=1)
    console.print(f"[green]✓[/] {target}: environment contract OK ({tasks} tasks)")


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

    try:
        result = rp.replay_step(run_dir, step, checkpoint, save)
        rows = rp.rescore(run_dir, step) if rescore else []
    except (ConfigError, ValueError) as e:
        raise _fail(str(e)) from None
    except USER_ERRORS as e:
        raise _fail(str(e)) from None
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
    from harmonyrl.telemetry.report import ReportError, write_report

    try:
        path = write_report(run_dir, max_episodes=episodes)
    except ReportError as e:
        raise _fail(str(e)) from None
    console.print(f"report: [bold]{path}[/]")


def main() -> None:  # pragma: no cover - entry point convenience
    app()


if __name__ == "__main__":  # python -m harmonyrl.cli
    app()
