"""The ``harmonyrl`` commands that look at things rather than train: ``check-env`` (a user environment against the
rollout's contract), ``check-checkpoint`` (a gpt-oss checkpoint's names and shapes), ``replay`` (one update re-run
from stored episodes), ``show`` (a step's episodes) and ``report`` (a run's HTML page). Registered on the app by
:mod:`harmonyrl.cli`; heavy imports inside each command."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from harmonyrl.cli.common import USER_ERRORS, console, fail
from harmonyrl.config import ConfigError
from harmonyrl.envs.loader import TargetError
from harmonyrl.errors import CheckpointError

if TYPE_CHECKING:  # torch behind it: imported inside the command
    from harmonyrl.jobs.replay import ReplayResult


def check_env_cmd(
    target: Annotated[
        str, typer.Argument(help="MODULE:FACTORY or path/to/file.py:FACTORY (a zero-argument callable).")
    ],
    tasks: Annotated[int, typer.Option(min=1, help="Train tasks to drive scripted episodes through.")] = 5,
    kwargs: Annotated[
        list[str] | None,
        typer.Argument(help="NAME=VALUE arguments for the factory, as env.kwargs.NAME=VALUE gives them in a run."),
    ] = None,
) -> None:
    """Check a user environment against the contract the rollout layer relies on, and call every tool with wrong
    arguments to show where each lands (an error observation the model reads, or a masked fault); exit 1 on any
    error (warnings, such as a tool without a description, are shown but do not fail it)."""
    from rich.markup import escape

    from harmonyrl.config_tree import parse_override
    from harmonyrl.envs.checker import check_target, errors

    try:
        given = dict(parse_override(text) for text in kwargs or [])
        found = check_target(target, tasks, {k.removeprefix("env.kwargs."): v for k, v in given.items()})
    except ConfigError as e:
        raise fail(f"{target}: {e}") from None
    except TargetError as e:
        raise fail(f"{target}: {e}") from None
    for issue in found.issues:
        mark = "[red]✗[/]" if issue.severity == "error" else "[yellow]![/]"
        console.print(f"{mark} {escape(str(issue))}", highlight=False, soft_wrap=True)
    for line in found.summary():  # where the model's wrong arguments land: observations, or masked faults
        console.print(f"· {escape(line)}", highlight=False, soft_wrap=True)
    if errors(found.issues):
        raise typer.Exit(code=1)
    warned = len(found.issues)
    note = f", {warned} warning{'s' * (warned > 1)}" if warned else ""
    driven = f"{min(tasks, found.train_tasks)} of {found.train_tasks} train tasks and 1 test task driven"
    console.print(f"[green]✓[/] {escape(target)}: environment contract OK ({driven}{note})", soft_wrap=True)


def _count(n: int) -> str:
    """``20.91 B``, ``1.3 M``, ``2.4 k``: a parameter count at the scale it has (a tiny model is not ``0.00 B``)."""
    for size, unit, digits in ((1e9, "B", 2), (1e6, "M", 1), (1e3, "k", 1)):
        if n >= size:
            return f"{n / size:.{digits}f} {unit}"
    return str(n)


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
        raise fail(str(e)) from None
    c = rep.config
    console.print(
        f"{folder}: gpt-oss, {c.num_hidden_layers} layers, {c.num_local_experts} experts top-{c.num_experts_per_tok}, "
        f"{c.num_attention_heads} heads / {c.num_key_value_heads} KV heads × {c.head_dim}, hidden {c.hidden_size}, "
        f"vocab {c.vocab_size} — {rep.num_parameters:,} parameters ({_count(rep.num_parameters)})",
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


def replay(
    run_dir: Annotated[Path, typer.Argument(help="A run folder with recorded rollouts (rollouts/step_*.parquet).")],
    step: Annotated[int, typer.Option(min=1, help="The RL step to re-run from its stored episodes.")],
    checkpoint: Annotated[
        Path | None,
        typer.Option(
            help="State after RL step N-1 (`replay --save DIR` of that step, or checkpoints/last of a run stopped "
            "there). Without it, steps 1..N-1 are replayed first from the run's recorded episodes."
        ),
    ] = None,
    save: Annotated[Path | None, typer.Option(help="Write the replayed state here (to chain replays).")] = None,
    rescore: Annotated[bool, typer.Option(help="Also re-score the stored episodes through the environment.")] = False,
) -> None:
    """Re-run one training step from stored episodes (no generation) and compare its metrics with metrics.jsonl, and
    its weights bit for bit where the run has a checkpoint of them; exit 1 on a difference."""
    from harmonyrl.jobs import replay as rp
    from harmonyrl.run.failure import is_storage_error, storage_message

    try:
        result = rp.replay_step(run_dir, step, checkpoint, save)
        rows = rp.rescore(run_dir, step) if rescore else []
    except (ConfigError, ValueError) as e:
        raise fail(str(e)) from None
    except USER_ERRORS as e:
        raise fail(str(e)) from None
    except OSError as e:
        if not is_storage_error(e):
            raise
        raise fail(storage_message(e, None)) from None
    _print_replay(run_dir, result)
    if rescore:
        changed = [r for r in rows if r.stored_reward != r.new_reward]
        console.print(f"re-scored {len(rows)} episodes: {len(changed)} rewards differ from the stored ones")
        for r in changed[:10]:
            console.print(f"  {r.task_id}: stored {r.stored_reward:g} → now {r.new_reward:g}")
    if result.identical is False or result.matches_metrics is False:
        raise typer.Exit(code=1)


def _print_replay(run_dir: Path, result: ReplayResult) -> None:
    """The replayed step's main metrics beside the recorded ones, then one verdict line per check."""
    from rich.markup import escape
    from rich.table import Table

    step = result.step
    how = f" (steps 1-{result.chained} replayed first: no checkpoint of the state before it)" if result.chained else ""
    console.print(f"replayed RL step {step} of {run_dir}{how}", highlight=False, soft_wrap=True)
    recorded = result.recorded or {}
    table = Table("metric", "replayed", "recorded (metrics.jsonl)", "", box=None, pad_edge=False)
    for key, value in sorted(result.metrics.items()):
        if key.startswith(("train/", "guard/")):
            was = recorded.get(key)
            mark = "" if was is None else "[green]=[/]" if (key, value, was) not in result.metric_diffs else "[red]≠[/]"
            table.add_row(key, f"{value:.9g}", "" if was is None else f"{was:.9g}", mark)
    console.print(table)
    if result.recorded is None:
        console.print(f"metrics.jsonl has no row for RL step {step}: nothing to compare the metrics with")
    elif diffs := result.metric_diffs:
        names = ", ".join(f"{k} ({v:.9g} vs {r:.9g})" for k, v, r in diffs[:5])
        console.print(f"metrics [red]differ[/] from metrics.jsonl in {len(diffs)}: {escape(names)}", soft_wrap=True)
    else:
        console.print(f"metrics: all {len(result.recorded)} the update computes [green]equal[/] to metrics.jsonl")
    if result.identical is None:
        console.print(
            f"weights: no checkpoint of the state after step {step} to compare with (the run keeps only its last)"
        )
    else:
        verdict = "[green]bit-identical[/]" if result.identical else f"[red]differ[/] in {', '.join(result.differing)}"
        console.print(f"weights vs {result.compared_with}: {verdict}", soft_wrap=True)


def show(
    run_dir: Annotated[Path, typer.Argument(help="A run folder with recorded rollouts.")],
    step: Annotated[int, typer.Option(min=1, help="RL step whose episodes to print.")],
    limit: Annotated[int, typer.Option(min=1, help="Episodes to print.")] = 8,
) -> None:
    """Print one step's episodes in readable harmony form: the task's prompt and expected answer, turns, channels,
    tool calls and results, reward and its terms."""
    from harmonyrl.rollout.show import format_episodes
    from harmonyrl.rollout.store import RolloutFileError, list_steps, read_step, step_path

    recorded = list_steps(run_dir)
    if not recorded and (run_dir / "config.yaml").is_file():
        raise fail(
            f"'{run_dir}' has no RL steps recorded: an SFT-only run (harmonyrl sft) or one stopped before its first "
            "RL step, or telemetry.record_rollouts=false"
        )
    if recorded and step not in recorded:
        raise fail(f"'{run_dir}' has no RL step {step} recorded (steps {recorded[0]}-{recorded[-1]} are)")
    try:
        trajectories = read_step(step_path(run_dir, step))
    except RolloutFileError as e:
        raise fail(str(e)) from None
    console.print(format_episodes(trajectories, limit, step, fit=not console.is_terminal))


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
        raise fail(str(e)) from None
    if (note := mismatch_note(collect_series(load_metrics(run_dir / "metrics.jsonl")[0]))) is not None:
        console.print(f"[yellow]{note}[/]", highlight=False)
    console.print(f"report: [bold]{path}[/]")


def register(app: typer.Typer) -> None:
    """Add these commands to ``app``, in the order ``--help`` lists them."""
    app.command(name="check-env")(check_env_cmd)
    app.command(name="check-checkpoint")(check_checkpoint_cmd)
    for command in (replay, show, report):
        app.command()(command)
