"""Does a curriculum or dynamic sampling learn a hard task that plain sampling does not, in the same budget?

    python benchmarks/curriculum.py [--steps 10] [--warm CKPT] [--out DIR] [key=value ...]

The task: the calculator with longer numbers (``env.levels``: level L appends L digits to the last operand,
docs/curriculum.md), training levels ``--levels`` (0-3), held-out levels ``--test-levels`` (1-3: the harder
end). One warm start, the default ``harmonyrl sft`` on the usual calculator (level 0; or ``--warm``, such a
checkpoint), is shared by three RL arms with the same seed, steps and episodes per step:

* ``plain``: the training split in order (what every run did before);
* ``dynamic``: the same stream, with ``rl.sampling.filter_uniform_groups`` refilling the batch (its extra groups
  are extra rollouts: the arm samples more episodes than the others, up to ``max_extra_groups`` per step);
* ``curriculum``: ``rl.curriculum`` drawing levels towards a 0.2 pass rate (the frontier), levels 0-1 open at
  first, the next one opened once the hardest open one passes 40 % (``open_at``).

Each arm evaluates held-out pass@1 every ``--eval-every`` steps. Reported per arm: the first evaluated step and
the training minutes (sum of ``time/step_s``) at which pass@1 reached ``--target``, and the final pass@1. Times
depend on the machine's load; the success figures are deterministic given the seed. Last line:
``RESULT plain_final=… dynamic_final=… curriculum_final=… plain_min=… dynamic_min=… curriculum_min=…``
(``_min``: minutes to the target, ``nan`` when not reached).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from harmonyrl.config import load_config
from harmonyrl.trainer.loop import sft_only, train

ARMS: dict[str, list[str]] = {
    "plain": [],
    "dynamic": ["rl.sampling.filter_uniform_groups=true", "rl.sampling.max_extra_groups=8"],
    # target 0.2: the frontier level (pass rate 0-0.4 when opened) is drawn most, not level 0 (0.3-0.6); the next
    # level opens once the hardest open one passes 40 % (ema 0.1: not on one lucky group; docs/curriculum.md)
    "curriculum": [
        "rl.curriculum.target=0.2",
        "rl.curriculum.ema=0.1",
        "rl.curriculum.start_levels=2",
        "rl.curriculum.open_at=0.4",
    ],
}


@dataclass(frozen=True)
class Arm:
    name: str
    before: float
    final: float
    steps_to_target: int | None
    minutes_to_target: float | None
    minutes: float
    episodes: int
    curve: list[tuple[int, float]]


def _read(run_dir: Path, name: str, target: float) -> Arm:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    curve = [(int(r["step"]), float(r["eval/success"])) for r in rows if "eval/success" in r]
    rl = [r for r in rows if r["phase"] == "rl"]
    hit = next((step for step, s in curve if s >= target), None)
    minutes_to = sum(r.get("time/step_s", 0.0) for r in rl if r["step"] <= hit) / 60 if hit is not None else None
    episodes = sum(int(r.get("rollout/episodes", 0)) for r in rl)
    minutes = sum(r.get("time/step_s", 0.0) for r in rl) / 60
    return Arm(name, curve[0][1], curve[-1][1], hit, minutes_to, minutes, episodes, curve)


def _minutes(value: float | None) -> str:
    return "nan" if value is None else f"{value:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10, help="RL steps per arm (the budget)")
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--levels", default="0,3", help="training levels LO,HI")
    parser.add_argument("--test-levels", default="1,3", help="held-out levels LO,HI")
    parser.add_argument("--target", type=float, default=0.10, help="held-out pass@1 counted as reached")
    parser.add_argument("--warm", type=Path, default=None, help="an SFT checkpoint to start from (default: train)")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument(
        "--curriculum",
        default=" ".join(ARMS["curriculum"]),
        help="the curriculum arm's settings, space-separated key=value (default: the frontier setting above)",
    )
    parser.add_argument("--out", type=Path, default=None, help="keep the runs here (default: a temp dir)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
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
        "eval.n_tasks=60",
        "eval.samples_per_task=2",
        *args.overrides,
    ]
    warm = args.warm
    if warm is None:
        warm = asyncio.run(sft_only(load_config(None, [*common, "run_name=warm"]), console))
    arms = []
    for name in args.arms.split(","):
        arm = args.curriculum.split() if name == "curriculum" else ARMS[name]
        run = [*base, f"model.init_from={warm}", "sft.steps=0", f"run_name={name}", *arm]
        asyncio.run(train(load_config(None, run), console, overwrite=True))
        arms.append(_read(out / name, name, args.target))
    arms.sort(key=lambda a: list(ARMS).index(a.name))  # the RESULT keys in one order, whatever order ran
    load = os.getloadavg()[0]
    print(f"warm start {warm}; {' '.join(base)}; curriculum arm: {args.curriculum}; load average {load:.1f}")
    print("| arm | pass@1 before | final | steps→target | min→target | RL minutes | episodes | curve |")
    print("|---|---|---|---|---|---|---|---|")
    for a in arms:
        curve = " ".join(f"{s}:{v:.2f}" for s, v in a.curve)
        to_min = "—" if a.minutes_to_target is None else f"{a.minutes_to_target:.1f}"
        print(f"| {a.name} | {a.before:.3f} | {a.final:.3f} | {a.steps_to_target or '—'} | {to_min} | "
              f"{a.minutes:.1f} | {a.episodes} | {curve} |")  # fmt: skip
    finals = " ".join(f"{a.name}_final={a.final:.3f}" for a in arms)
    mins = " ".join(f"{a.name}_min={_minutes(a.minutes_to_target)}" for a in arms)
    print(f"RESULT {finals} {mins}")


if __name__ == "__main__":
    main()
