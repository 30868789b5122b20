"""A sweep folder and its Optuna study: what is searched, which trials ran, and running more of them.

The folder holds ``sweep.yaml`` (the base config's fixed overrides, the space, the seeds: everything
``--resume`` needs), ``base.yaml`` (a copy of the ``-c`` file, when one was given), ``preset.yaml`` (a copy of the
``-p`` preset's file, when one was given), ``study.db`` (the Optuna study, SQLite) and ``trials/`` (each trial's
config, console log and run folder). Trials run ``jobs`` at a time, each in its own process
(:mod:`harmonyrl.sweep.runner`); Optuna is asked for a trial in this process's main thread and told its outcome
there too, so only the pruner's reports come from the threads that watch the processes.

A trial cut short because the sweep stopped (Ctrl-C or SIGTERM, or the sweep process killed) is recorded as failed
and marked ``interrupted``; it does not count towards ``--trials``, and its parameters are queued so ``--resume``
runs them first.
"""

from __future__ import annotations

import fcntl
import shutil
import signal
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Literal

import yaml
from pydantic import Field, ValidationError

from harmonyrl.config import ConfigError, RunConfig, dump_config, load_config
from harmonyrl.frozen import Frozen
from harmonyrl.sweep.runner import Reporter, TrialJob, TrialOutcome, TrialRunner
from harmonyrl.sweep.space import Param, Scalar, distributions, override

if TYPE_CHECKING:
    import optuna

STUDY_NAME = "harmonyrl-sweep"
INTERRUPTED = "interrupted"
"""User attribute of a trial the sweep's stopping cut short (not counted towards ``--trials``)."""


class SweepError(ValueError):
    """A mistake in how a sweep is started or resumed: one line."""


class SweepSpec(Frozen):
    """What a sweep searches and how; ``sweep.yaml`` in the sweep folder."""

    base: str | None = None
    """The base config file inside the sweep folder (a copy of ``-c``), or none: the defaults."""
    preset: str | None = None
    """The named preset's file inside the sweep folder (a copy of ``-p``'s), applied before ``base``, or none."""
    fixed: tuple[str, ...] = ()
    """Overrides every trial gets (``key=value``, as ``harmonyrl train`` takes them)."""
    for_pruning: tuple[str, ...] = ()
    """Overrides the sweep added so the pruner has periodic evaluations (``eval.every``): given to the trials, left
    out of ``best_config.yaml``."""
    space: dict[str, Param]
    """The searched config keys and their ranges."""
    seed: int = 0
    """Seed of the TPE sampler (each trial trains with the base config's own ``seed``)."""
    tpe_startup: int = Field(10, ge=1)
    """Trials drawn at random before TPE models the results."""
    prune: bool = True
    """Stop trials whose periodic held-out pass@1 is below the median of earlier trials at the same RL step."""
    prune_after: int = Field(4, ge=1)
    """Finished trials before the pruner may stop one."""
    split: Literal["validation", "test"] = "test"
    """The split the trials' held-out evaluations (the objective, the pruning) run on: ``validation`` for a new
    sweep unless ``--split test`` says otherwise; a ``sweep.yaml`` written before validation splits existed lacks
    it and means ``test``, so a resumed study keeps measuring what it measured. Not in ``best_config.yaml``."""


@dataclass(frozen=True)
class Sweep:
    """An open sweep folder: its spec, and the base config of its trials."""

    folder: Path
    spec: SweepSpec

    @property
    def db(self) -> Path:
        return self.folder / "study.db"

    def config(self, extra: list[str] | tuple[str, ...] = (), trial: bool = True) -> RunConfig:
        """The base config with the fixed overrides (and, for a ``trial``, the pruning ones) and ``extra`` ones
        (ConfigError on a mistake)."""
        base = None if self.spec.base is None else self.folder / self.spec.base
        presets = [] if self.spec.preset is None else [self.folder / self.spec.preset]
        added = (*self.spec.for_pruning, f"eval.split={self.spec.split}") if trial else ()
        return load_config(base, [*self.spec.fixed, *added, *extra], presets)

    def trial_config(self, number: int, params: Mapping[str, Scalar], threads: int) -> RunConfig:
        """Trial ``number``'s whole config: the base, its parameters, its run folder and its share of the cores."""
        own = [f"output_dir={self.folder / 'trials'}", f"run_name=trial_{number:04d}", f"threads={threads}"]
        return self.config([*(override(k, v) for k, v in params.items()), *own])


def create_sweep(folder: Path, config_file: Path | None, spec: SweepSpec, preset: Path | None = None) -> Sweep:
    """Make a new sweep folder (refusing one that holds anything) with its spec and base config (copies of the
    ``-c`` file and of the preset's, so a resumed sweep runs what the first one ran)."""
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise SweepError(f"sweep folder '{folder}' exists and is not empty: continue it with --resume {folder}")
    folder.mkdir(parents=True, exist_ok=True)
    if config_file is not None:
        shutil.copyfile(config_file, folder / "base.yaml")
        spec = spec.model_copy(update={"base": "base.yaml"})
    if preset is not None:
        shutil.copyfile(preset, folder / "preset.yaml")
        spec = spec.model_copy(update={"preset": "preset.yaml"})
    (folder / "sweep.yaml").write_text(yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False))
    return Sweep(folder, spec)


def open_sweep(folder: Path) -> Sweep:
    """An existing sweep folder, to resume (SweepError when it is not one)."""
    path = folder / "sweep.yaml"
    if not path.is_file() or not (folder / "study.db").is_file():
        raise SweepError(f"cannot resume '{folder}': it is not a sweep folder (no sweep.yaml and study.db)")
    try:
        return Sweep(folder, SweepSpec.model_validate(yaml.safe_load(path.read_text())))
    except (yaml.YAMLError, ValidationError) as e:
        raise SweepError(f"cannot resume '{folder}': its sweep.yaml is damaged ({str(e).splitlines()[0]})") from None


@contextmanager
def locked(sweep: Sweep) -> Iterator[None]:
    """Hold the sweep folder for this process: two sweeps on one study would each take the other's running
    trials for interrupted ones."""
    with (sweep.folder / ".lock").open("w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SweepError(f"sweep folder '{sweep.folder}' is in use by another harmonyrl sweep") from None
        yield


@contextmanager
def term_as_interrupt() -> Iterator[None]:
    """SIGTERM (``kill PID``, a batch system ending the job) stops the sweep as Ctrl-C does: the running trials'
    processes are ended and recorded as interrupted, instead of outliving the sweep. Main thread only (Python
    delivers signals there); elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def load_study(sweep: Sweep) -> optuna.Study:
    """The sweep's study in its SQLite file (created on first use), maximising the objective. The TPE seed moves
    on by the trials already in the study, so a resumed sweep does not redraw its first random trials."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the sweep prints its own line per trial
    spec = sweep.spec
    pruner: optuna.pruners.BasePruner = (
        optuna.pruners.MedianPruner(n_startup_trials=spec.prune_after, n_warmup_steps=0)
        if spec.prune
        else optuna.pruners.NopPruner()
    )
    study = optuna.create_study(
        storage=f"sqlite:///{sweep.db.resolve()}",
        study_name=STUDY_NAME,
        direction="maximize",
        pruner=pruner,
        load_if_exists=True,
    )
    seed = spec.seed + len(study.get_trials(deepcopy=False))
    study.sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=spec.tpe_startup)
    return study


def counted(study: optuna.Study) -> int:
    """Trials that count towards ``--trials``: every finished one except those the sweep's stopping cut short."""
    return sum(1 for t in study.trials if t.state.is_finished() and not t.user_attrs.get(INTERRUPTED))


def requeue_interrupted(study: optuna.Study) -> int:
    """Mark the trials a killed sweep left running as failed and interrupted, and queue their parameters again;
    returns how many."""
    from optuna.trial import TrialState

    storage = study._storage  # optuna's public Study API cannot set an attribute of another process's trial
    study_id = storage.get_study_id_from_name(STUDY_NAME)
    stale = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    for t in stale:
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, t.number)
        storage.set_trial_user_attr(trial_id, INTERRUPTED, True)
        storage.set_trial_user_attr(trial_id, "error", "interrupted: the sweep process ended while it ran")
        study.tell(t.number, state=TrialState.FAIL)
        study.enqueue_trial(dict(t.params))
    return len(stale)


def record(study: optuna.Study, trial: optuna.Trial, outcome: TrialOutcome) -> None:
    """Tell the study how a trial ended (a pruned trial keeps its last reported value, Optuna's rule)."""
    from optuna.trial import TrialState

    trial.set_user_attr("minutes", round(outcome.minutes, 3))
    if outcome.error is not None:
        trial.set_user_attr("error", outcome.error)
    if outcome.state == "complete" and outcome.value is not None:
        study.tell(trial, outcome.value)
    elif outcome.state == "pruned":
        study.tell(trial, state=TrialState.PRUNED)
    else:
        study.tell(trial, state=TrialState.FAIL)


def reporter(trial: optuna.Trial) -> Reporter:
    """The pruner's side of a running trial: report a held-out pass@1 at an RL step, hear whether to stop."""

    def report(step: int, value: float) -> bool:
        trial.report(value, step)
        return trial.should_prune()

    return report


def _prepare(sweep: Sweep, trial: optuna.Trial, threads: int) -> TrialJob | TrialOutcome:
    """Write trial ``trial``'s config; a combination of values the config refuses is a failed trial, not a crash."""
    params: dict[str, Scalar] = dict(trial.params)
    trials = sweep.folder / "trials"
    trials.mkdir(exist_ok=True)
    name = f"trial_{trial.number:04d}"
    trial.set_user_attr("run_dir", str(trials / name))
    try:
        cfg = sweep.trial_config(trial.number, params, threads)
    except ConfigError as e:
        return TrialOutcome("failed", None, 0.0, str(e))
    path = trials / f"{name}.yaml"
    path.write_text(dump_config(cfg))
    return TrialJob(trial.number, params, path, trials / name, trials / f"{name}.log")


def run_trials(
    sweep: Sweep,
    study: optuna.Study,
    space: Mapping[str, Param],
    total: int,
    jobs: int,
    threads: int,
    runner: TrialRunner,
    on_done: Callable[[optuna.Study, int, TrialOutcome], None],
) -> None:
    """Run trials ``jobs`` at a time until ``total`` count (see :func:`counted`). Ctrl-C stops the running ones,
    records them as interrupted (queued again for ``--resume``) and re-raises."""
    from optuna.trial import TrialState

    dists = distributions(space)
    stop = threading.Event()
    running: dict[Future[TrialOutcome], optuna.Trial] = {}
    to_start = total - counted(study)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        try:
            while to_start > 0 or running:
                while to_start > 0 and len(running) < jobs:
                    trial = study.ask(dists)
                    to_start -= 1
                    job = _prepare(sweep, trial, threads)
                    if isinstance(job, TrialOutcome):
                        record(study, trial, job)
                        on_done(study, trial.number, job)
                        continue
                    running[pool.submit(runner, job, reporter(trial), stop)] = trial
                done, _ = wait(running, return_when=FIRST_COMPLETED) if running else (set(), set())
                for future in done:
                    outcome = _outcome(future)  # before the trial leaves ``running``: it may re-raise Ctrl-C
                    trial = running.pop(future)
                    record(study, trial, outcome)
                    on_done(study, trial.number, outcome)
        except KeyboardInterrupt:
            stop.set()
            wait(running)  # each runner ends its process once ``stop`` is set
            for trial in running.values():
                trial.set_user_attr(INTERRUPTED, True)
                trial.set_user_attr("error", "interrupted: the sweep was stopped")
                study.tell(trial, state=TrialState.FAIL)
                study.enqueue_trial(dict(trial.params))
            raise


def _outcome(future: Future[TrialOutcome]) -> TrialOutcome:
    """A runner's outcome; a runner that raised (a bug, not the trial's run failing) is a failed trial, named."""
    try:
        return future.result()
    except Exception as e:
        return TrialOutcome("failed", None, 0.0, f"the trial runner raised {type(e).__name__}: {e}")
