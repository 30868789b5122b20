"""``harmonyrl sweep`` once its options are parsed: check everything, then run the study and write its outputs.

Every check that a user's mistake can fail (the space, the base config, each range against the schema, optuna
installed, the folder) runs before the folder is made or any trial starts; each raises a one-line error
(:class:`SpaceError`, :class:`SweepError`, :class:`~harmonyrl.config.ConfigError`) that the CLI prints.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from rich.console import Console

from harmonyrl.config import RunConfig, load_config
from harmonyrl.sweep.outputs import OBJECTIVE, print_table, rows, write_outputs
from harmonyrl.sweep.runner import TrialOutcome, TrialRunner, run_train_process
from harmonyrl.sweep.space import build_space, check_space, describe
from harmonyrl.sweep.study import (
    Sweep,
    SweepError,
    SweepSpec,
    counted,
    create_sweep,
    load_study,
    locked,
    open_sweep,
    requeue_interrupted,
    run_trials,
    term_as_interrupt,
)
from harmonyrl.telemetry.progress import duration_text
from harmonyrl.threads import available_cores

if TYPE_CHECKING:
    import optuna


def need_optuna() -> None:
    """Optuna is an optional dependency: without it, a one-line error naming the extra."""
    try:
        import optuna  # noqa: F401
    except ImportError:
        raise SweepError("harmonyrl sweep needs Optuna: pip install 'harmonyrl[sweep]'") from None


def new_spec(
    config_file: Path | None, overrides: Sequence[str], params: Sequence[str], space_file: Path | None, trials: int,
    seed: int, prune: bool, preset: Path | None = None, split: Literal["validation", "test"] = "validation",
) -> SweepSpec:  # fmt: skip
    """The spec of a new sweep, checked against the config schema (see the module doc); ``preset``: a named
    preset's file, under ``config_file``. Pruning needs periodic held-out evaluations: without ``eval.every`` the
    sweep sets it to a quarter of ``rl.steps``. The trials evaluate on ``split`` (validation: the test split stays
    for measuring the chosen config once)."""
    space = build_space(space_file, params)
    presets = [] if preset is None else [preset]
    base = load_config(config_file, list(overrides), presets)
    fixed = list(overrides)
    pruning = [f"eval.every={max(1, base.rl.steps // 4)}"] if prune and base.eval.every == 0 else []
    check_space(space, fixed, lambda extra: load_config(config_file, [*pruning, *extra], presets))
    return SweepSpec(
        fixed=tuple(fixed),
        for_pruning=tuple(pruning),
        space=space,
        seed=seed,
        tpe_startup=max(2, min(10, trials // 3)),
        prune=prune,
        prune_after=max(2, min(5, trials // 4)),
        split=split,
    )


def start(
    console: Console, out: Path, config_file: Path | None, overrides: Sequence[str], params: Sequence[str],
    space_file: Path | None, trials: int, jobs: int, seed: int, prune: bool,
    runner: TrialRunner = run_train_process, preset: Path | None = None,
    split: Literal["validation", "test"] = "validation",
) -> Sweep:  # fmt: skip
    """A new sweep in folder ``out``: ``trials`` trials, ``jobs`` at a time; ``preset``: a named preset's file;
    ``split``: what the trials evaluate on."""
    spec = new_spec(config_file, overrides, params, space_file, trials, seed, prune, preset, split)
    need_optuna()
    sweep = create_sweep(out, config_file, spec, preset)
    return run(console, sweep, trials, jobs, runner)


def resume(console: Console, folder: Path, trials: int, jobs: int, runner: TrialRunner = run_train_process) -> Sweep:
    """Continue the sweep in ``folder`` until ``trials`` trials count in all."""
    need_optuna()
    return run(console, open_sweep(folder), trials, jobs, runner)


def run(console: Console, sweep: Sweep, trials: int, jobs: int, runner: TrialRunner) -> Sweep:
    """Run the sweep's trials and write its outputs; the table at the end."""
    with locked(sweep):
        base = sweep.config()
        threads = max(1, (base.threads or available_cores()) // jobs)
        study = load_study(sweep)
        already = len(study.get_trials(deepcopy=False))  # the TPE seed moved on by as many (load_study)
        requeued = requeue_interrupted(study)
        _announce(console, sweep, base, study, trials, jobs, threads, (already, requeued))
        try:
            with term_as_interrupt():
                run_trials(sweep, study, sweep.spec.space, trials, jobs, threads, runner, _on_done(console, sweep))
        except KeyboardInterrupt:
            write_outputs(sweep, study)
            raise SweepError(f"sweep stopped: continue it with harmonyrl sweep --resume {sweep.folder}") from None
        winner = write_outputs(sweep, study)
        print_table(console, rows(study), list(sweep.spec.space))
        files = ", ".join(str(sweep.folder / f) for f in ("trials.csv", "trials.png"))
        if winner is None:
            console.print(f"no trial completed: no best config  ({files})", highlight=False, soft_wrap=True)
        else:
            console.print(
                f"best: trial {winner.number}, {OBJECTIVE} [bold]{winner.value:.1%}[/]  "
                f"config: [bold]{sweep.folder / 'best_config.yaml'}[/]  ({files})",
                soft_wrap=True,
            )
    return sweep


def _announce(
    console: Console, sweep: Sweep, base: RunConfig, study: optuna.Study, trials: int, jobs: int, threads: int,
    resumed: tuple[int, int],
) -> None:  # fmt: skip
    """What is searched and how, before the first trial; ``resumed``: trials already in the study, and how many of
    them a killed sweep left running (queued again)."""
    spec, ev = sweep.spec, base.eval
    already, requeued = resumed
    seed = f"{spec.seed} + {already} (trials already in the study)" if already else str(spec.seed)
    console.print(f"sweep folder [bold]{sweep.folder}[/]  study {sweep.db}", soft_wrap=True)
    console.print(
        f"objective: {OBJECTIVE} (eval/success: {ev.n_tasks} {ev.split} tasks × {ev.samples_per_task} samples at "
        f"T={ev.temperature:g}, seed {base.seed}), maximised; TPE sampler seed {seed}",
        highlight=False,
        soft_wrap=True,
    )
    if not spec.prune:
        prune = "pruning: off"
    elif ev.every == 0 or ev.every >= base.rl.steps:
        prune = f"pruning: on, but eval.every={ev.every} gives no held-out evaluation during RL: nothing to prune on"
    else:
        prune = (
            f"pruning: held-out pass@1 every eval.every={ev.every} RL steps, below the median of earlier trials at "
            f"the same step (after {spec.prune_after} finished trials)"
        )
    console.print(prune, highlight=False, soft_wrap=True)
    console.print("space: " + "  ".join(describe(k, p) for k, p in spec.space.items()), highlight=False, soft_wrap=True)
    if spec.fixed:
        console.print("fixed: " + "  ".join(spec.fixed), highlight=False, soft_wrap=True)
    if spec.for_pruning:
        added = "  ".join(spec.for_pruning)
        console.print(f"added for pruning (not in best_config.yaml): {added}", highlight=False, soft_wrap=True)
    done = counted(study)
    again = f", {requeued} interrupted trial(s) queued again" if requeued else ""
    console.print(
        f"trials: {done} done, {max(0, trials - done)} to run, {jobs} at a time, threads={threads} each{again}",
        highlight=False,
        soft_wrap=True,
    )


def _on_done(console: Console, sweep: Sweep) -> Callable[[optuna.Study, int, TrialOutcome], None]:
    """After each trial: one line, and the table and best config rewritten."""

    def done(study: optuna.Study, number: int, outcome: TrialOutcome) -> None:
        if outcome.value is None:
            value = ""
        elif outcome.state == "pruned":
            value = f" at periodic held-out pass@1 {outcome.value:.1%}"
        else:
            value = f" {OBJECTIVE} {outcome.value:.1%}"
        why = f": {outcome.error}" if outcome.error else ""
        params = next((r.params for r in rows(study) if r.number == number), {})
        shown = " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())
        console.print(
            f"trial {number} {outcome.state}{value} in {duration_text(outcome.minutes)}  {shown}{why}",
            highlight=False,
            soft_wrap=True,
        )
        write_outputs(sweep, study, plot=False)

    return done
