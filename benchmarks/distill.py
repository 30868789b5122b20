"""On-policy distillation against RL alone and SFT on the teacher's samples: a student, a stronger teacher trained
here, equal student steps, over seeds.

    python benchmarks/distill.py [-c RUN.yaml] [--seeds 0,1,2] [--steps 10] [--every 5] [--teacher CKPT]
                                 [--warm CKPT] [--out DIR] [--quick] [key=value ...]

**Task.** The calculator by default; ``-c RUN.yaml`` (a run config, e.g. ``src/harmonyrl/presets/maze.yaml``) sets
the env, the rollout sizes and limits, the evaluation and the model for every run here (teacher, warm start, arms,
the teacher's sampling for the SFT arms); the key=value arguments apply over it.

**Teacher.** ``--teacher-preset`` trained here on the calculator: ``harmonyrl train`` with ``--teacher-sft`` SFT
steps and ``--teacher-rl`` RL steps (or ``--teacher CKPT``, a checkpoint made before). Its held-out success is
measured per seed on the same held-out tasks, samples and seeds as the students'. **The default teacher is the
student's own preset (micro) trained longer, not a larger one**: on two shared cores the ``small`` preset's SFT
costs ~0.9 s a step (400 steps: 6 minutes, the whole budget), and a ``nano`` student (tried with a micro teacher:
0 % held-out pass@1 at T = 1 after 150 and 400 SFT steps, greedy ≤ 14 %) gives RL no reward to learn from and moves
in none of the three arms within the budget. ``--teacher-preset small`` (with a longer budget) is the issue's
wider/deeper pairing.

**Student.** ``--student-preset`` (default ``micro``). One warm start
(``--student-sft`` SFT steps on the scripted expert, seed 0), shared by the seeds (the budget again: the seeds vary
the student's sampling, the SFT arm's teacher samples and order, and the evaluations' sampling, not the warm start);
then, per seed, four arms from it, each ``--steps`` student updates of ``rollout.tasks_per_step ×
rollout.group_size`` episodes (default sizes: :data:`BUDGET`):

* ``rl``: RL on the env's reward (the default GRPO update);
* ``distill``: the same run with ``rl.distill.teacher`` (the env's reward kept unless ``--no-env-reward``;
  ``rl.distill.weight``, ``rl.distill.kind`` from ``--kind``): the teacher scores the student's own samples and the
  per-token reverse KL trains the student toward it;
* ``sft``: supervised steps on the teacher's own successful episodes of the same number of train tasks
  (``steps × tasks_per_step`` tasks, ``group_size`` samples each at T = 1, failures dropped: rejection-sampled
  distillation), batches of the same ``tasks_per_step × group_size`` episodes, the RL learning rate and optimizer;
  cross-entropy on the teacher's sampled tokens only; ``rl.epochs`` optimizer steps on each batch, as the RL arms.
  The env's reward chooses its data, so it aims at a distribution better than the teacher's;
* ``sft_all``: the same on **all** the teacher's episodes (faults excepted), failures kept: the forward-KL
  counterpart of ``distill`` (both aim at the teacher's own distribution; ``distill`` on the student's prefixes,
  ``sft_all`` on the teacher's).

**Measured.** Held-out pass@1 (``eval.n_tasks`` tasks × ``eval.samples_per_task`` samples at T = 1) before,
every ``--every`` steps and at the end, and greedy success at the end; student minutes: the wall time of the
student's steps (rollouts and updates, with the teacher's scoring passes for ``distill``; the teacher's sampling
and the SFT steps for ``sft`` and ``sft_all``), evaluations excluded. Steps to reach ``--fraction`` of the teacher's
held-out success: the first evaluation at or above it (``inf`` if none). Arms alternate their order with the seed
(the machine's load drifts).

**Resumable.** Each arm's figures, each seed's teacher score, the teacher and the warm start are kept in ``--out``
with the settings that made them (every argument but ``--seeds`` and ``--out``): run again with the same settings,
the benchmark reuses what is there, so seeds run by separate invocations (``--seeds 1``, ``--seeds 2``) are pooled
by one (``--seeds 0,1,2``); figures kept under other settings stop it in one line.

**Reported.** A table per seed and arm, and ``RESULT teacher=… rl=… sft=… sft_all=… distill=… *_greedy=… *_min=…
distill_vs_rl_pp=… distill_vs_sft_pp=… distill_vs_sft_all_pp=… fraction=… *_steps_to=…
seeds=…``: held-out pass@1 means over seeds with ``_se`` standard errors (:func:`harmonyrl.telemetry.stats.mean_se`);
the ``_vs_`` gaps in points, paired by seed; ``*_steps_to``: mean over seeds of the steps to ``fraction`` × the
teacher's success (``inf`` when a seed never got there). ``--quick``: one seed, 2 steps, tiny sizes (a smoke test).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from harmonyrl.config import RunConfig, load_config
from harmonyrl.harmony.codecs import load_codec
from harmonyrl.jobs.train import eval_only, sft_only, train
from harmonyrl.learn.batch import collate, score
from harmonyrl.learn.optimizer_step import scaled_lr, steps_taken, warmup_scale
from harmonyrl.rl.collect import rollout_params
from harmonyrl.rollout.scheduler import group_requests
from harmonyrl.rollout.team import run_rollouts
from harmonyrl.run.checkpoint import save_checkpoint
from harmonyrl.run.setup import load_for, make_engine, make_factory, make_model, setup_process
from harmonyrl.telemetry.metrics import read_metrics
from harmonyrl.telemetry.stats import mean_se
from harmonyrl.types import Trajectory

ARMS = ("rl", "sft", "sft_all", "distill")
BUDGET = ["rollout.tasks_per_step=4", "rollout.group_size=8", "eval.n_tasks=50", "eval.samples_per_task=2"]
"""The calculator's sizes (a key=value argument replaces any of them; ``-c`` brings its own): ~10 minutes on two
shared cores."""
QUICK = ["rollout.tasks_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=24", "eval.n_tasks=4",
         "eval.samples_per_task=1", "env.n_train=64", "env.n_test=8"]  # fmt: skip


@dataclass(frozen=True)
class Score:
    """Held-out success of one evaluation: pass@1 at T = 1 (``eval/success``) and greedy (``eval_greedy/success``)."""

    sampled: float
    greedy: float


@dataclass
class Arm:
    """One arm of one seed: its held-out curve ``[(step, pass@1)]``, its final greedy success and its student
    seconds per step."""

    curve: list[tuple[int, float]] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)
    greedy: float = math.nan

    @property
    def final(self) -> float:
        return self.curve[-1][1]

    @property
    def minutes(self) -> float:
        return sum(self.step_s) / 60

    def steps_to(self, target: float) -> float:
        """The first evaluated step whose pass@1 reaches ``target`` (0: already at the start; inf: never)."""
        return next((float(s) for s, v in self.curve if v >= target), math.inf)


def main() -> None:
    args = _parse()
    console = Console()
    out = args.out or Path(tempfile.mkdtemp(prefix="harmonyrl-distill-"))
    sizes = [] if args.config else BUDGET  # a run config brings its own sizes
    common = [*sizes, *(QUICK if args.quick else []), f"eval.every={args.every}", "threads=1", *args.overrides]
    teacher = args.teacher or _made(out / "teacher.json", args, lambda: _train_teacher(args, common, out, console))
    seeds = [int(s) for s in args.seeds.split(",")]
    results: dict[int, dict[str, Arm]] = {}
    teacher_success: dict[int, Score] = {}
    warm_cfg = [*common, f"model.preset={args.student_preset}", f"sft.steps={args.student_sft}", "run_name=warm",
                f"output_dir={out}"]  # fmt: skip
    warm = args.warm or _made(
        out / "warm.json",
        args,
        lambda: asyncio.run(sft_only(load_config(args.config, warm_cfg), console, overwrite=True)),
    )  # shared by the seeds
    for i, seed in enumerate(seeds):
        console.rule(f"seed {seed}")
        base = [*common, f"seed={seed}", f"output_dir={out / f'seed{seed}'}"]
        kept = _kept(out / f"seed{seed}" / "teacher.json", args)
        if kept is not None:  # a run of this --out evaluated it before: resumable, seed by seed
            teacher_success[seed] = Score(**kept)
        else:
            teacher_cfg = load_config(args.config, [*base, *_preset(teacher)])
            teacher_success[seed] = asyncio.run(_evaluate(teacher_cfg, teacher))
            _keep(out / f"seed{seed}" / "teacher.json", args, vars(teacher_success[seed]))
        student = [*base, f"model.preset={args.student_preset}", f"model.init_from={warm}", "sft.steps=0",
                   f"rl.steps={args.steps}"]  # fmt: skip
        order = ARMS if i % 2 == 0 else tuple(reversed(ARMS))
        results[seed] = {arm: _kept_arm(out / f"seed{seed}" / f"{arm}.json", arm, student, teacher, args, console)
                         for arm in order}  # fmt: skip
    _report(results, teacher_success, args, console, out)


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-c", "--config", type=Path, default=None, help="a run config for every run (default: calculator)")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=10, help="student updates per arm")
    p.add_argument("--every", type=int, default=5, help="held-out evaluation every N student steps")
    p.add_argument("--student-preset", default="micro")
    p.add_argument("--student-sft", type=int, default=300, help="SFT steps of the student's warm start")
    p.add_argument("--warm", type=Path, default=None, help="a student warm start made before (skips the SFT)")
    p.add_argument("--teacher-preset", default="micro")
    p.add_argument("--teacher-sft", type=int, default=400)
    p.add_argument("--teacher-rl", type=int, default=10)
    p.add_argument("--teacher", type=Path, default=None, help="a teacher checkpoint made before (skips training)")
    p.add_argument("--weight", type=float, default=1.0, help="rl.distill.weight")
    p.add_argument("--no-env-reward", action="store_true", help="the distill arm without the env's reward")
    p.add_argument("--kind", choices=("sampled", "full"), default="sampled", help="rl.distill.kind of the distill arm")
    p.add_argument("--distill-lr", type=float, default=None, help="the distill arm's rl.lr (default: every arm's)")
    p.add_argument("--fraction", type=float, default=0.5, help="of the teacher's held-out success")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--quick", action="store_true")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    if args.quick:
        args.seeds, args.steps, args.every, args.student_sft, args.teacher_sft, args.teacher_rl = "0", 2, 1, 3, 3, 1
        args.student_preset = args.teacher_preset = "nano"
    return args


def _preset(checkpoint: Path) -> list[str]:
    return [f"model.init_from={checkpoint}", "sft.steps=0"]


def _train_teacher(args: argparse.Namespace, common: list[str], out: Path, console: Console) -> Path:
    console.rule(f"teacher: {args.teacher_preset}, {args.teacher_sft} SFT + {args.teacher_rl} RL steps")
    sizes = [f"model.preset={args.teacher_preset}", f"sft.steps={args.teacher_sft}", f"rl.steps={args.teacher_rl}"]
    cfg = load_config(args.config, [*common, *sizes, "eval.every=0", f"output_dir={out}", "run_name=teacher"])
    result = asyncio.run(train(cfg, console, overwrite=True))  # a folder left here is a killed run's
    return result.run_dir / "checkpoints" / "final"


async def _evaluate(cfg: RunConfig, checkpoint: Path) -> Score:
    metrics = await eval_only(cfg, checkpoint, Console(quiet=True))
    return Score(metrics["eval/success"], metrics["eval_greedy/success"])


def _kept_arm(
    record: Path, arm: str, student: list[str], teacher: Path, args: argparse.Namespace, console: Console
) -> Arm:
    """The arm's figures from ``record`` if an earlier run of this ``--out`` with the same settings finished it (so
    seeds can be run by separate invocations and pooled by one), else run it and write them there."""
    kept = _kept(record, args)
    if kept is not None:
        console.print(f"[bold]{arm}[/]: kept from {record}")
        return Arm([(int(s), float(v)) for s, v in kept["curve"]], kept["step_s"], kept["greedy"])
    arm_result = _run_arm(arm, student, teacher, args, console)
    _keep(record, args, vars(arm_result))
    return arm_result


def _made(record: Path, args: argparse.Namespace, make: Callable[[], Path]) -> Path:
    """A checkpoint this ``--out`` made before with the same settings (the teacher, the warm start), else ``make()``."""
    kept = _kept(record, args)
    if kept is not None:
        return Path(kept["checkpoint"])
    checkpoint = make()
    _keep(record, args, {"checkpoint": str(checkpoint)})
    return checkpoint


def _settings(args: argparse.Namespace) -> dict[str, str]:
    """What a kept figure depends on: every argument but the seed list and where the figures go."""
    return {k: str(v) for k, v in sorted(vars(args).items()) if k not in ("seeds", "out")}


def _kept(record: Path, args: argparse.Namespace) -> dict[str, Any] | None:
    """The figures ``record`` keeps (None: none yet); kept under other settings: a one-line stop."""
    if not record.is_file():
        return None
    data = json.loads(record.read_text())
    if data["settings"] != _settings(args):
        raise SystemExit(f"{record} was made with other settings: use another --out, or delete it to run it again")
    return dict(data["figures"])


def _keep(record: Path, args: argparse.Namespace, figures: dict[str, Any]) -> None:
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps({"settings": _settings(args), "figures": figures}))


def _run_arm(arm: str, student: list[str], teacher: Path, args: argparse.Namespace, console: Console) -> Arm:
    console.print(f"[bold]{arm}[/]")
    if arm in ("sft", "sft_all"):
        cfg = load_config(args.config, [*student, f"run_name={arm}"])
        return asyncio.run(_sft_arm(cfg, teacher, args.steps, args.every, successes_only=arm == "sft"))
    extra = [f"rl.distill.teacher={teacher}", f"rl.distill.weight={args.weight}", f"rl.distill.kind={args.kind}"]
    extra = extra if arm == "distill" else []
    if arm == "distill" and args.distill_lr is not None:
        extra.append(f"rl.lr={args.distill_lr}")
    if arm == "distill" and args.no_env_reward:
        extra.append("rl.distill.env_reward=false")
    cfg = load_config(args.config, [*student, *extra, f"run_name={arm}"])
    result = asyncio.run(train(cfg, Console(quiet=True), overwrite=True))  # no record kept: a killed run's folder
    rows = read_metrics(result.run_dir / "metrics.jsonl")
    # the evaluations before and after RL have rows of their own; a periodic one is on its step's RL row
    curve = [(int(str(r["step"])), float(str(r["eval/success"]))) for r in rows if "eval/success" in r]
    seconds = [float(str(r["time/step_s"])) for r in rows if r["phase"] == "rl"]
    return Arm(_deduplicated(curve), seconds, result.greedy_after)


def _deduplicated(curve: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """One point per step (the last evaluation runs at the last step, as a periodic one may have)."""
    return sorted(dict(curve).items())


async def _sft_arm(cfg: RunConfig, teacher: Path, steps: int, every: int, successes_only: bool) -> Arm:
    """SFT of the warm-started student on the teacher's successful samples (see the module docstring)."""
    setup_process(cfg.seed, cfg.threads)
    start = time.monotonic()
    samples = await _teacher_samples(cfg, teacher, steps, successes_only)
    sampling_s = time.monotonic() - start
    assert cfg.model.init_from is not None
    first = await _evaluate(cfg, cfg.model.init_from)
    arm = Arm([(0, first.sampled)], [sampling_s], first.greedy)
    if not samples:  # the teacher solved none: nothing to imitate, the student stays where it started
        arm.curve.append((steps, first.sampled))
        return arm
    tok = load_codec(cfg.model.tokenizer)
    model = make_model(cfg, tok)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.rl.lr,
                                  weight_decay=0.0, betas=(0.9, 0.99))  # fmt: skip
    rng, pool = random.Random(cfg.seed), []
    size = cfg.rollout.episodes_per_step
    folder = cfg.output_dir / str(cfg.run_name)
    for step in range(1, steps + 1):
        t0 = time.monotonic()
        while len(pool) < size:  # seeded epochs over the samples
            epoch = list(samples)
            rng.shuffle(epoch)
            pool.extend(epoch)
        batch, pool = collate(pool[:size], tok.special.endoftext), pool[size:]
        for _ in range(cfg.rl.epochs):  # as many optimizer steps on the batch as the RL arms' rl.epochs
            scored = score(model, batch.input_ids, batch.attention_mask, needed=batch.loss_mask)
            loss = -(scored.logprobs * batch.loss_mask).sum() / batch.loss_mask.sum().clamp(min=1)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.rl.max_grad_norm)
            with scaled_lr(optimizer, warmup_scale(steps_taken(optimizer) + 1, cfg.rl.lr_warmup_steps)):
                optimizer.step()  # the RL arms' warm-up, if any
        arm.step_s.append(time.monotonic() - t0)
        if step % every == 0 or step == steps:
            scored_now = await _evaluate(cfg, save_checkpoint(folder / f"step{step}", model, None, step, {}))
            arm.curve.append((step, scored_now.sampled))
            arm.greedy = scored_now.greedy
    return arm


async def _teacher_samples(cfg: RunConfig, teacher: Path, steps: int, successes_only: bool) -> list[Trajectory]:
    """The teacher's episodes of ``steps × tasks_per_step`` train tasks, ``group_size`` each, sampled as the RL
    arms sample theirs (the run's decoding and episode limits: turns, tokens, length; the successful ones only with
    ``successes_only``; faulted ones never)."""
    tok = load_codec(cfg.model.tokenizer)
    factory = make_factory(cfg)
    engine, limits = await make_engine(cfg, load_for(teacher, tok, cfg.rollout.max_seq_len), None)
    tasks = factory.tasks("train")[: steps * cfg.rollout.tasks_per_step]
    requests = group_requests(tasks, cfg.rollout.group_size, cfg.seed)
    result = await run_rollouts(engine, factory, tok, requests, rollout_params(cfg, tok), limits, 64)
    await engine.close()
    return [t for t in result.trajectories if t.failure is None and (t.success or not successes_only)]


def _report(
    results: dict[int, dict[str, Arm]], teacher: dict[int, Score], args: argparse.Namespace, console: Console, out: Path
) -> None:
    seeds = sorted(results)
    table = Table(title=f"distillation: {args.steps} student steps, student {args.student_preset}, "
                        f"teacher {args.teacher_preset}")  # fmt: skip
    cols = (
        "seed",
        "arm",
        "pass@1 curve (step: value)",
        "final",
        "greedy",
        "student min",
        f"steps to {args.fraction:g}×T",
    )
    for col in cols:
        table.add_column(col, justify="right")
    for seed in seeds:
        target = args.fraction * teacher[seed].sampled
        for arm in ARMS:
            a = results[seed][arm]
            curve = " ".join(f"{s}:{v:.2f}" for s, v in a.curve)
            table.add_row(str(seed), arm, curve, f"{a.final:.3f}", f"{a.greedy:.3f}", f"{a.minutes:.2f}",
                          f"{a.steps_to(target):g}")  # fmt: skip
        table.add_row(str(seed), "teacher", "", f"{teacher[seed].sampled:.3f}", f"{teacher[seed].greedy:.3f}", "", "")
    console.print(table)
    summary: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()},
                               "teacher": {s: vars(t) for s, t in teacher.items()},
                               "arms": {s: {a: vars(results[s][a]) for a in ARMS} for s in seeds}}  # fmt: skip
    (out / "distill.json").write_text(json.dumps(summary, indent=1, default=str))
    fields = [_est("teacher", [teacher[s].sampled for s in seeds])]
    fields += [_est(arm, [results[s][arm].final for s in seeds]) for arm in ARMS]
    fields += [_est("teacher_greedy", [teacher[s].greedy for s in seeds])]
    fields += [_est(f"{arm}_greedy", [results[s][arm].greedy for s in seeds]) for arm in ARMS]
    fields += [f"{arm}_min={statistics.fmean(results[s][arm].minutes for s in seeds):.2f}" for arm in ARMS]
    for other in ("rl", "sft", "sft_all"):
        gaps = [100 * (results[s]["distill"].final - results[s][other].final) for s in seeds]
        fields.append(_est(f"distill_vs_{other}_pp", gaps, digits=1))
    fields.append(f"fraction={args.fraction:g}")
    for arm in ARMS:
        reach = [results[s][arm].steps_to(args.fraction * teacher[s].sampled) for s in seeds]
        fields.append(f"{arm}_steps_to={statistics.fmean(reach):g}")
    fields.append(f"seeds={','.join(map(str, seeds))}")
    print(f"details: {out / 'distill.json'}")
    print("RESULT " + " ".join(fields))


def _est(name: str, values: list[float], digits: int = 3) -> str:
    return mean_se(values).fields(name, digits)


if __name__ == "__main__":
    main()
