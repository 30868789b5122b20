"""Does a curriculum or dynamic sampling learn a hard task that plain sampling does not, in the same budget?

    python benchmarks/curriculum.py [--steps 120] [--seeds 3] [--warm CKPT] [--out DIR] [key=value ...]

The task: the calculator with longer numbers (``env.levels``: level L appends L digits to the last operand,
docs/curriculum.md), training and held-out levels 0-3 (``--levels``, ``--test-levels``): half the problems
(levels 2-3) are out of the warm start's reach, so uniform sampling spends half its episodes on groups that all
fail. One warm start, the default ``harmonyrl sft`` on the usual calculator (level 0; or ``--warm``, such a
checkpoint), is shared by three RL arms with the same seed, steps and episodes per step:

* ``plain``: the training split in order (what every run did before);
* ``dynamic``: the same stream, with ``rl.sampling.filter_uniform_groups`` refilling the batch (its extra groups
  are extra rollouts: the arm samples more episodes than the others, up to ``max_extra_groups`` per step);
* ``curriculum``: ``rl.curriculum`` drawing levels towards a 0.5 pass rate (``--curriculum`` sets other
  settings, e.g. the frontier setting ``rl.curriculum.target=0.2 rl.curriculum.start_levels=2 …``).

**Splits (issue 41).** Each arm's evaluations during training (200 tasks × 4 samples at T=1 every
``--eval-every`` steps) are on the **validation** split: the curves, the steps and minutes to ``--target`` and the
best evaluated pass@1 are validation figures, where settings are looked at. The warm start and each arm's final
weights are then evaluated **once on the test split** with the run's own eval settings (``test-final.json`` in the
run folder, ``warm.test.json`` in the seed's folder, the ``harmonyrl eval --metrics-out`` record), and those are the
figures reported. Training reads neither split and nothing is picked by them (no early stopping, no best
checkpoint), so one run serves both.

Times depend on the machine's load; the success figures are deterministic given the seed. ``--seeds N`` repeats
every arm with seeds 0..N-1 (other training, validation and test problems, the same warm start); runs and test
evaluations finished in ``--out`` are reused. Last line, over the seeds: ``RESULT seeds=… split=test
curve_split=validation before=… plain_final=… plain_final_se=… … curriculum_vs_plain_pp=… curriculum_vs_plain_se=…
… plain_val_min=… … plain_val_best=… …`` (``_final``: test pass@1 of the final weights, mean and SE over seeds;
``_vs_plain``: the test difference to plain in points, paired by seed; ``_val_min``: validation minutes to the
target, ``nan`` unless every seed reached it; ``_val_best``: the highest validation pass@1 of each run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml
from rich.console import Console

from harmonyrl.config import RunConfig, dump_config, load_config
from harmonyrl.jobs.train import eval_only, sft_only, train
from harmonyrl.telemetry.stats import over_seeds, paired

ARMS: dict[str, list[str]] = {
    "plain": [],
    "dynamic": ["rl.sampling.filter_uniform_groups=true", "rl.sampling.max_extra_groups=8"],
    # target 0.5: the levels whose groups pass about half the time, where a group-relative advantage is largest,
    # are drawn most; a level every group fails (levels 2-3 for this warm start) keeps only the floor's share
    "curriculum": ["rl.curriculum.target=0.5"],
}


@dataclass(frozen=True)
class Test:
    """One test-split evaluation (the ``harmonyrl eval --metrics-out`` record): pass@1 and greedy."""

    success: float
    success_se: float
    greedy: float


@dataclass(frozen=True)
class Arm:
    """One run: its validation curve and figures, and the test evaluations of its start and end."""

    name: str
    before: float
    final: float
    steps_to_target: int | None
    minutes_to_target: float | None
    minutes: float
    episodes: int
    curve: list[tuple[int, float]]
    test_before: Test
    test_final: Test

    @property
    def best(self) -> float:
        """The highest evaluated validation pass@1 of the run (before RL included)."""
        return max(v for _, v in self.curve)


def _test(cfg: RunConfig, checkpoint: Path, record: Path, console: Console) -> Test:
    """``checkpoint`` evaluated once on the test split with ``cfg``'s eval settings (``cfg`` is the run's config
    with ``eval.split=test``); the record is kept in ``record`` and read back, never measured twice."""
    if not record.is_file():
        metrics = asyncio.run(eval_only(cfg, checkpoint, console))
        doc = {"checkpoint": str(checkpoint), "split": cfg.eval.split, "metrics": metrics}
        record.write_text(json.dumps(doc, indent=1) + "\n")
    doc = json.loads(record.read_text())
    if doc["split"] != "test":
        raise SystemExit(f"curriculum.py: {record} is not a test-split evaluation: delete it to measure it again")
    m = doc["metrics"]
    return Test(float(m["eval/success"]), float(m["eval/success_se"]), float(m["eval_greedy/success"]))


def _read(run_dir: Path, name: str, target: float, tests: tuple[Test, Test]) -> Arm:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    curve = [(int(r["step"]), float(r["eval/success"])) for r in rows if "eval/success" in r]
    rl = [r for r in rows if r["phase"] == "rl"]
    hit = next((step for step, s in curve if s >= target), None)
    minutes_to = sum(r.get("time/step_s", 0.0) for r in rl if r["step"] <= hit) / 60 if hit is not None else None
    episodes = sum(int(r.get("rollout/episodes", 0)) for r in rl)
    minutes = sum(r.get("time/step_s", 0.0) for r in rl) / 60
    return Arm(name, curve[0][1], curve[-1][1], hit, minutes_to, minutes, episodes, curve, *tests)


def _minutes(value: float | None) -> str:
    return "nan" if value is None else f"{value:.2f}"


def _same_settings(run_dir: Path, cfg: RunConfig) -> None:
    """Stop the benchmark if ``run_dir`` holds a run of other settings than ``cfg`` (an earlier command with other
    flags into the same ``--out``) rather than report or continue it."""
    recorded, wanted = yaml.safe_load((run_dir / "config.yaml").read_text()), yaml.safe_load(dump_config(cfg))
    recorded.pop("output_dir", None), wanted.pop("output_dir", None)  # a moved or linked folder is the same run
    if recorded != wanted:
        raise SystemExit(
            f"curriculum.py: {run_dir} holds a finished run of other settings: delete it or use another --out"
        )


def _finished_as(run_dir: Path, cfg: RunConfig) -> bool:
    """``run_dir`` holds a finished run (``summary.json``) of exactly ``cfg`` (of other settings: stop)."""
    if not (run_dir / "summary.json").is_file():
        return False
    _same_settings(run_dir, cfg)
    return True


def _warm_start(cfg: RunConfig, console: Console) -> Path:
    """The shared warm start (``harmonyrl sft`` with ``cfg``): an earlier invocation's in the same ``--out`` is
    reused if finished and continued if stopped, after checking it has the same settings."""
    run_dir = cfg.output_dir / str(cfg.run_name)
    started = (run_dir / "config.yaml").is_file()
    if started:
        _same_settings(run_dir, cfg)
    return asyncio.run(sft_only(cfg, console, resume=started))


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=120, help="RL steps per arm (the budget)")
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument("--levels", default="0,3", help="training levels LO,HI")
    parser.add_argument("--test-levels", default="0,3", help="held-out levels LO,HI")
    parser.add_argument("--target", type=float, default=0.15, help="held-out pass@1 counted as reached")
    parser.add_argument("--seeds", type=int, default=1, help="run every arm with seeds 0..N-1 (other problems)")
    parser.add_argument("--warm", type=Path, default=None, help="an SFT checkpoint to start from (default: train)")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument(
        "--curriculum",
        default=" ".join(ARMS["curriculum"]),
        help="the curriculum arm's settings, space-separated key=value (default: target 0.5, above)",
    )
    parser.add_argument("--out", type=Path, default=None, help="keep the runs here; finished ones are reused")
    parser.add_argument("overrides", nargs="*")
    return parser


def main() -> None:
    args = _parser().parse_args()
    if any(o.split("=", 1)[0] == "seed" for o in args.overrides):
        raise SystemExit("curriculum.py: the seeds are 0..N-1 of --seeds N, not a seed= override")
    if any(o.split("=", 1)[0] == "eval.split" for o in args.overrides):
        raise SystemExit("curriculum.py: the curves are on validation and the report on test; eval.split is not set")
    out = args.out or Path(tempfile.mkdtemp(prefix="harmonyrl-curriculum-"))
    console = Console()
    lo, hi = args.levels.split(",")
    tlo, thi = args.test_levels.split(",")
    common = ["threads=1", f"output_dir={out}", *args.overrides]
    base = [
        *common,
        f"env.levels=[{lo},{hi}]",
        f"env.test_levels=[{tlo},{thi}]",
        "env.n_train=4000",
        "env.n_test=200",
        "rollout.tasks_per_step=8",
        "rollout.group_size=8",
        f"rl.steps={args.steps}",
        f"eval.every={args.eval_every}",
        "eval.split=validation",
        "eval.n_tasks=200",
        "eval.samples_per_task=4",
        *args.overrides,
    ]
    warm = args.warm
    if warm is None:
        warm = _warm_start(load_config(None, [*common, "run_name=warm"]), console)
    unknown = set(args.arms.split(",")) - set(ARMS)
    if unknown:
        raise SystemExit(f"curriculum.py: unknown arm(s) {', '.join(sorted(unknown))}; choose from {', '.join(ARMS)}")
    names = sorted(args.arms.split(","), key=list(ARMS).index)  # the RESULT keys in one order
    runs: dict[str, list[Arm]] = {name: [] for name in names}
    for seed in range(args.seeds):
        folder = out / f"seed{seed}"
        for name in names:
            arm = args.curriculum.split() if name == "curriculum" else ARMS[name]
            where = [f"output_dir={folder}", f"run_name={name}", f"seed={seed}"]
            settings = [*base, *where, f"model.init_from={warm}", "sft.steps=0", *arm]
            cfg = load_config(None, settings)
            if not _finished_as(folder / name, cfg):  # a run finished with this very config is reused
                asyncio.run(train(cfg, console, overwrite=True))
            on_test = load_config(None, [*settings, "eval.split=test"])  # the arm's settings touch no evaluation
            before = _test(on_test, warm, folder / "warm.test.json", console)
            final = _test(on_test, folder / name / "checkpoints" / "final", folder / name / "test-final.json", console)
            runs[name].append(_read(folder / name, name, args.target, (before, final)))
    load = os.getloadavg()[0]
    print(f"warm start {warm}; {' '.join(base)}; curriculum arm: {args.curriculum}; load average {load:.1f}")
    print("| arm | seed | test before | test final ± SE | test greedy after | validation best | steps→target "
          "(val) | min→target (val) | RL minutes | episodes | validation curve |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in names:
        for seed, a in enumerate(runs[name]):
            curve = " ".join(f"{s}:{v:.2f}" for s, v in a.curve)
            to_min = "—" if a.minutes_to_target is None else f"{a.minutes_to_target:.1f}"
            steps = "—" if a.steps_to_target is None else a.steps_to_target
            t0, t1 = a.test_before, a.test_final
            print(f"| {a.name} | {seed} | {t0.success:.3f} | {t1.success:.3f} ± {t1.success_se:.3f} | "
                  f"{t1.greedy:.3f} | {a.best:.3f} | {steps} | {to_min} | {a.minutes:.1f} | {a.episodes} | "
                  f"{curve} |")  # fmt: skip
    print(f"RESULT seeds={args.seeds} split=test curve_split=validation {result_figures(runs)}")


def result_figures(runs: dict[str, list[Arm]]) -> str:
    """The RESULT line's figures: test pass@1 before and each arm's final (mean, SE over seeds), each arm's paired
    test difference to ``plain`` (points), and the validation minutes to the target and best pass@1."""
    names = list(runs)
    first = runs[names[0]]
    parts = [f"before={over_seeds({i: a.test_before.success for i, a in enumerate(first)}).mean:.3f}"]
    for n in names:
        final = over_seeds({i: a.test_final.success for i, a in enumerate(runs[n])})
        parts.append(f"{n}_final={final.mean:.3f} {n}_final_se={final.se:.3f}")
    if "plain" in runs:
        plain = {i: a.test_final.success for i, a in enumerate(runs["plain"])}
        for n in (n for n in names if n != "plain"):
            gap = paired(plain, {i: a.test_final.success for i, a in enumerate(runs[n])})
            parts.append(f"{n}_vs_plain_pp={100 * gap.mean:.1f} {n}_vs_plain_se={100 * gap.se:.1f}")
    to = {n: [a.minutes_to_target for a in runs[n]] for n in names}
    for n in names:
        parts.append(f"{n}_val_min={_minutes(None if None in to[n] else _mean([m for m in to[n] if m is not None]))}")
    parts += [f"{n}_val_best={_mean([a.best for a in runs[n]]):.3f}" for n in names]
    return " ".join(parts)


if __name__ == "__main__":
    main()
