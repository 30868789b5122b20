"""``harmonyrl compare``: several RL algorithms on the same env, model, seeds and sample budget.

For each seed one SFT warm start is trained and shared by every algorithm, so the algorithms differ only
in the RL update. Each algorithm then runs ``rl.steps`` steps (the same episodes per step: the same sample
budget) with held-out evaluations every ``eval.every`` steps, and the comparison reads its metrics.jsonl:

* steps and minutes until held-out pass@1 first reaches ``target``;
* pass@1 at half the sample budget (sample efficiency) and at the end (final performance);
* the worst grad norm and the largest KL to the reference seen during training (stability).

Writes ``OUT/compare.json``, ``OUT/compare.md`` (the table) and ``OUT/compare.png`` (learning curves).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from harmonyrl import preset_files
from harmonyrl.algorithms.choices import NamedAlgorithm
from harmonyrl.config import ConfigError, RLConfig, RunConfig, load_config
from harmonyrl.jobs.train import sft_only, train
from harmonyrl.telemetry.stats import mean_se, paired


@dataclass(frozen=True)
class AlgoResult:
    algo: str
    seeds: int
    steps_to_target: float | None
    """Mean over seeds of the first evaluated step at which pass@1 ≥ target (None: some seed never did)."""
    minutes_to_target: float | None
    success_at_half: float
    """Held-out pass@1 at the evaluation closest to half the sample budget (mean over seeds)."""
    final_success: float
    final_greedy: float
    worst_grad_norm: float
    max_kl: float
    minutes: float
    curve: list[tuple[int, float]]
    """(RL step, held-out pass@1) averaged over seeds."""
    final_se: float
    """SE of ``final_success``: over the seeds with two or more, else the last evaluation's task-clustered SE."""
    final_greedy_se: float
    per_seed: dict[int, tuple[float, float]] = field(default_factory=dict)
    """Seed → (held-out pass@1 before RL, at the end): what the paired comparisons are computed from."""
    gain: float = math.nan
    """Final − before pass@1, paired by seed (every arm of a seed shares its warm start), mean over seeds."""
    gain_se: float = math.nan
    vs_first: float = math.nan
    """Final pass@1 minus the first algorithm's, paired by seed (0 for the first itself)."""
    vs_first_se: float = math.nan


def algorithm_names() -> list[str]:
    """The named algorithms: one per algorithm preset (``harmonyrl/presets/algorithms/NAME.yaml``), sorted."""
    return [p.name for p in preset_files.available(preset_files.algorithms_folder())]


def named_algorithm(name: str) -> NamedAlgorithm:
    """The typed ``rl`` choices of the algorithm preset ``name`` (a shipped file that does not validate is a bug,
    raised as such)."""
    path = preset_files.find(name, preset_files.algorithms_folder())
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or set(data) != {"rl"}:
        raise ValueError(f"{path}: an algorithm preset holds one 'rl' section, nothing else")
    return NamedAlgorithm.model_validate(data["rl"])


def parse_algos(text: str) -> list[str]:
    names = [a.strip() for a in text.split(",") if a.strip()]
    known = algorithm_names()
    unknown = [a for a in names if a not in known]
    if unknown or not names:
        raise ConfigError(f"unknown algorithm(s) {unknown or text!r}; choose from {', '.join(known)}")
    return names


def _with(config: RunConfig, **changes: Any) -> RunConfig:
    """A copy of ``config`` with top-level sections replaced, re-validated."""
    return RunConfig.model_validate(config.model_dump() | changes)


def _rl_for(config: RunConfig, algo: str) -> RLConfig:
    """The user's ``rl`` settings (steps, lr, guards, ...) with the named algorithm's choices on top, each one it
    sets replacing the user's whole (:class:`~harmonyrl.algorithms.choices.NamedAlgorithm`)."""
    return RLConfig.model_validate(config.rl.model_dump() | named_algorithm(algo).model_dump(exclude_none=True))


def _read(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _summarise(algo: str, runs: list[list[dict[str, Any]]], minutes: list[float], target: float) -> AlgoResult:
    """One arm's figures from its runs, seed ``i``'s metrics rows at ``runs[i]``."""
    curves, to_target, minutes_to, half, grad, kl = [], [], [], [], 0.0, 0.0
    for rows in runs:
        evals = [(r["step"], r["eval/success"]) for r in rows if "eval/success" in r]
        rl = [r for r in rows if r["phase"] == "rl"]
        last = max(step for step, _ in evals)
        curves.append(evals)
        hit = next((step for step, s in evals if s >= target), None)
        to_target.append(hit)
        if hit is not None and rl:
            elapsed = sum(r.get("time/step_s", 0.0) for r in rl if r["step"] <= hit) / 60
            minutes_to.append(elapsed)
        half.append(min(evals, key=lambda e: abs(e[0] - last / 2))[1])
        grad = max([grad, *(r.get("train/grad_norm", 0.0) for r in rl)])
        kl = max([kl, *(r.get("train/kl_ref_k3", 0.0) for r in rl)])
    steps = sorted({s for c in curves for s, _ in c})
    curve = [(s, sum(v for c in curves for cs, v in c if cs == s) / len(curves)) for s in steps]
    reached = all(h is not None for h in to_target)
    final = [c[-1][1] for c in curves]
    greedy = [next(r["eval_greedy/success"] for r in reversed(rows) if "eval_greedy/success" in r) for rows in runs]
    final_se, greedy_se = (_final_se(runs, key) for key in ("eval/success", "eval_greedy/success"))
    per_seed = {seed: (c[0][1], c[-1][1]) for seed, c in enumerate(curves)}
    return AlgoResult(
        algo=algo,
        seeds=len(runs),
        steps_to_target=sum(h for h in to_target if h is not None) / len(runs) if reached else None,
        minutes_to_target=sum(minutes_to) / len(minutes_to) if reached and minutes_to else None,
        success_at_half=sum(half) / len(half),
        final_success=sum(final) / len(final),
        final_greedy=sum(greedy) / len(greedy),
        final_se=final_se,
        final_greedy_se=greedy_se,
        per_seed=per_seed,
        worst_grad_norm=grad,
        max_kl=kl,
        minutes=sum(minutes) / len(minutes),
        curve=curve,
    )


def _check_same_run(run_dir: Path, config: RunConfig) -> None:
    """A ``FileExistsError`` unless the finished run in ``run_dir`` was made with ``config`` (its resolved
    ``config.yaml``; where the folders are, and so the warm start's path, may differ: a comparison can be moved)."""
    moved = {"output_dir": None, "run_name": None}
    recorded = load_config(run_dir / "config.yaml", ["model.init_from=null"]).model_dump() | moved
    wanted = config.model_dump() | moved
    for d in (recorded, wanted):
        d["model"] = {**d["model"], "init_from": None}
    if recorded != wanted:
        diff = sorted(k for k in wanted if recorded.get(k) != wanted[k])
        raise FileExistsError(f"'{run_dir}' was run with another config (sections {', '.join(diff)}): delete it")


def with_paired(results: list[AlgoResult]) -> list[AlgoResult]:
    """``results`` with each arm's gain over its warm start and its difference to the first arm, both paired by seed
    (:func:`~harmonyrl.telemetry.stats.paired`): the seeds' warm starts differ far more than the algorithms do, and
    pairing removes what a seed's warm start adds to every arm. One seed: the differences, without an SE."""
    if not results:
        return results
    first = {seed: end for seed, (_, end) in results[0].per_seed.items()}
    out = []
    for r in results:
        before = {k: b for k, (b, _) in r.per_seed.items()}
        end = {k: e for k, (_, e) in r.per_seed.items()}
        gain, vs = paired(before, end), paired(first, end)
        out.append(replace(r, gain=gain.mean, gain_se=gain.se, vs_first=vs.mean, vs_first_se=vs.se))
    return out


def _final_se(runs: list[list[dict[str, Any]]], key: str) -> float:
    """The SE of the seeds' mean final ``key``: between seeds (:func:`mean_se`) with two or more; with one, its last
    evaluation's own task-clustered ``key_se`` (``nan`` if it has none)."""
    if len(runs) > 1:
        return mean_se([next(r[key] for r in reversed(rows) if key in r) for rows in runs]).se
    return next((r[f"{key}_se"] for r in reversed(runs[0]) if f"{key}_se" in r), math.nan)


def _heading(console: Console, title: str) -> None:
    """A rule across a terminal; a plain line elsewhere (a file has no width to fill)."""
    if console.is_terminal:
        console.rule(title)
    else:
        console.print(f"── {title} ──", highlight=False, markup=False)


async def compare(
    config: RunConfig,
    algos: list[str],
    seeds: int,
    target: float,
    out: Path,
    console: Console,
    reuse: bool = False,
) -> list[AlgoResult]:
    """Run every algorithm for every seed from a shared SFT warm start; write and return the comparison.

    ``reuse``: ``out`` may hold an earlier comparison of the same config; its finished warm starts and runs
    (``summary.json``) are read instead of run again, so a stopped comparison continues (an unfinished run folder is
    an error: delete it)."""
    if out.exists() and any(out.iterdir()) and not reuse:
        raise FileExistsError(f"comparison folder '{out}' already exists and is not empty")
    every = config.eval.every or max(1, config.rl.steps // 5)
    results = []
    warm: dict[int, Path] = {}
    for seed in range(seeds):
        done = out / f"sft-seed{seed}" / "checkpoints" / "sft"  # an earlier comparison's warm start (reuse)
        if config.model.init_from is not None:
            warm[seed] = config.model.init_from
            continue
        if reuse and (done / "config.json").is_file():
            warm[seed] = done
            continue
        _heading(console, f"SFT warm start, seed {seed}")
        sft_cfg = _with(config, seed=seed, output_dir=out, run_name=f"sft-seed{seed}")
        warm[seed] = await sft_only(sft_cfg, console)
    for algo in algos:
        runs, minutes = [], []
        for seed in range(seeds):
            run_dir = out / f"{algo}-seed{seed}"
            model = config.model.model_copy(update={"init_from": warm[seed]})
            cfg = _with(
                config,
                seed=seed,
                output_dir=out,
                run_name=f"{algo}-seed{seed}",
                model=model.model_dump(),
                sft={**config.sft.model_dump(), "steps": 0},  # the shared warm start above is this run's SFT
                rl=_rl_for(config, algo).model_dump(),
                eval=config.eval.model_copy(update={"every": every}).model_dump(),
            )
            if reuse and (run_dir / "summary.json").is_file():
                _check_same_run(run_dir, cfg)
                runs.append(_read(run_dir))
                minutes.append(float(json.loads((run_dir / "summary.json").read_text())["minutes"]))
                continue
            if run_dir.exists():
                raise FileExistsError(f"'{run_dir}' is an unfinished run of an earlier comparison: delete it")
            _heading(console, f"{algo}, seed {seed}")
            result = await train(cfg, console)
            runs.append(_read(result.run_dir))
            minutes.append(result.minutes)
        results.append(_summarise(algo, runs, minutes, target))
    results = with_paired(results)
    write_outputs(results, target, config, out, seeds)
    console.print(table(results, target))
    if (note := ranking_note(results, config, seeds)) is not None:
        console.print(f"[yellow]{note}[/]", highlight=False, soft_wrap=True)
    return results


def ranking_note(results: list[AlgoResult], config: RunConfig, seeds: int) -> str | None:
    """A warning when the arms' final held-out pass@1 differ by no more than sampling noise (two standard errors
    of the difference of two arms, each measured on ``eval.n_tasks × eval.samples_per_task × seeds`` samples):
    the table then ranks nothing. None when the spread is larger."""
    if len(results) < 2:
        return None
    finals = [r.final_success for r in results]
    n = config.eval.n_tasks * config.eval.samples_per_task * seeds
    p = sum(finals) / len(finals)
    noise = 2 * math.sqrt(2 * max(p * (1 - p), 1 / n) / n)  # a floor: all-0 % arms are no evidence of a tie
    spread = max(finals) - min(finals)
    if spread > noise:
        return None
    return (
        f"note: the arms cannot be ranked at this budget: final pass@1 spans {min(finals):.1%}-{max(finals):.1%}, "
        f"within the noise of {n} held-out samples per arm (about ±{noise:.1%}); raise rl.steps, eval.n_tasks or "
        "--seeds, and give the warm start enough SFT steps that RL has something to learn from"
    )


def table(results: list[AlgoResult], target: float) -> Table:
    t = Table(title=f"algorithms on the same env, model, seeds and sample budget (target pass@1 {target:.0%})")
    for col in COLUMNS:
        t.add_column(col, justify="right")
    for r in results:
        t.add_row(*_cells(r))
    return t


COLUMNS = ("algo", "steps→target", "min→target", "pass@1 @½ budget", "final pass@1", "final greedy",
           "gain (paired)", "vs first (paired)", "worst grad norm", "max KL", "minutes")  # fmt: skip
"""The comparison's columns, on the console and in compare.md alike; the gains in points, the first arm's the
reference of "vs first"."""


def _points(mean: float, se: float) -> str:
    """``+21.2 ± 5.5`` points (no ``±`` without an SE: one seed)."""
    return f"{100 * mean:+.1f}" + ("" if math.isnan(se) else f" ± {100 * se:.1f}")


def _cells(r: AlgoResult) -> list[str]:
    never = "not reached"
    return [
        r.algo,
        f"{r.steps_to_target:.0f}" if r.steps_to_target is not None else never,
        f"{r.minutes_to_target:.1f}" if r.minutes_to_target is not None else never,
        f"{r.success_at_half:.1%}",
        f"{r.final_success:.1%} ± {100 * r.final_se:.1f}",
        f"{r.final_greedy:.1%} ± {100 * r.final_greedy_se:.1f}",
        _points(r.gain, r.gain_se),
        _points(r.vs_first, r.vs_first_se),
        f"{r.worst_grad_norm:.2f}",
        f"{r.max_kl:.3f}",
        f"{r.minutes:.1f}",
    ]


def write_outputs(results: list[AlgoResult], target: float, config: RunConfig, out: Path, seeds: int = 1) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_text(json.dumps({"target": target, "results": [asdict(r) for r in results]}, indent=2))
    header = "| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS) + "\n"
    rows = "".join("| " + " | ".join(_cells(r)) + " |\n" for r in results)
    budget = config.rl.steps * config.rollout.episodes_per_step
    note = ranking_note(results, config, seeds)
    tail = f"\n{note}\n" if note is not None else ""
    spread = "the SE over the seeds" if seeds > 1 else "the evaluation's task-clustered SE (one seed)"
    (out / "compare.md").write_text(
        f"Target pass@1 {target:.0%}; budget {budget} episodes per run; {seeds} seed(s) (0–{seeds - 1}); held-out "
        f"{config.eval.split} split, {config.eval.n_tasks} tasks × {config.eval.samples_per_task} samples; ± is "
        f"{spread}, in points; gain and vs first ({results[0].algo if results else '—'}) are paired by seed (each "
        f"seed's arms share its warm start and held-out tasks).\n\n{header}{rows}{tail}"
    )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for r in results:
        ax.plot([s for s, _ in r.curve], [v for _, v in r.curve], marker="o", label=r.algo)
    ax.axhline(target, color="grey", linestyle="--", linewidth=1, label="target")
    ax.set_xlabel("RL step")
    ax.set_ylabel("held-out pass@1")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "compare.png", dpi=120)
    plt.close(fig)
