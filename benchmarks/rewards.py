"""Code-checked reward vs a learned reward model vs an LLM judge: the instruct env trained three ways from one warm
start, same budget (docs/rewards.md).

    python benchmarks/rewards.py --prepare [--seeds 0,1,2] [--steps 6] [--out DIR] [key=value ...]
    python benchmarks/rewards.py --warm RUN/checkpoints/sft --rm RM/checkpoint [--steps 6] [key=value ...]

**Inputs.** ``--prepare`` makes them in ``DIR/inputs`` with docs/rewards.md's commands (:func:`prepare`; each step
kept when its output is there, so a killed run resumes): the instruct warm start (micro, 400 SFT steps), preference
pairs from its answers to 1,600 training prompts, a reward model trained on them (120 steps) and the judge (the
warm start fine-tuned for 150 steps to grade those answers). Otherwise ``--warm`` and ``--rm`` name them. The
inputs are shared by the seeds; ``--seeds`` varies the RL runs (sampling and task order), each in ``DIR/seed<s>``.

Each arm is a ``harmonyrl train`` run from ``--warm`` (``model.init_from``, no SFT) with the same seed, tasks and
steps; only the reward differs:

* ``code``  — the env's code-checked reward (every constraint met: 1, else 0); it is the truth, so it has no proxy
  agreement to report;
* ``rm``    — the reward model alone (``reward.model``, ``reward.env_weight=0``);
* ``judge`` — the judge alone (``reward.judge``, ``reward.env_weight=0``), served by its own embedded engine: the
  checkpoint ``--judge`` names, or with ``--train-judge PAIRS`` the warm start fine-tuned to grade on the answers of
  that pairs file (the reward model's data): the judge prompt of :mod:`harmonyrl.rewards.judge` → a final message
  holding ``round(10 · constraints_met)``. A warm start that was never taught to grade replies with prose, so every
  verdict fails to parse, every episode is masked and the fault breaker stops the arm (measured: docs/rewards.md).

Reported per arm: held-out true success (code-checked ``eval/success``) before and after, the proxy's agreement with
the checkers (``reward/<term>_agreement``: within a group, the fraction of differently-checked episode pairs the proxy
ranks the same way), the proxy reward and the true train success (``rollout/success``), each as a mean over the first
and last ``--window`` RL steps (default a quarter of ``--steps``), the gaming verdict on those two curves
(:func:`harmonyrl.rewards.gaming.gaming_verdict`: the proxy rising beyond 2 standard errors while true success falls
beyond 2), seconds per step and judge tokens per step. Written to ``--out``: ``table.md``, ``results.json`` and
``rewards.png`` per seed (per arm: true success and the proxy vs step, agreement vs step). Last line
(:func:`pooled`): ``RESULT code_final=… code_final_se=… code_change_pp=… code_change_pp_se=… rm_final=… …
rm_gamed=K of N rm_agree_end=… judge_… judge_s_per_step=… seeds=…``: means and standard errors over the seeds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from harmonyrl.rewards.gaming import gaming_verdict, proportion_trend, trend

TERMS = {"code": "reward/env", "rm": "reward/model", "judge": "reward/judge"}


def arm_overrides(arm: str, rm: Path, judge: Path) -> list[str]:
    """The reward settings of one arm."""
    if arm == "rm":
        return [f"reward.model={rm}", "reward.env_weight=0"]
    if arm == "judge":
        return [f"reward.judge.checkpoint={judge}", "reward.judge.weight=1", "reward.env_weight=0"]
    return []  # the env's own reward: no reward section, so no proxy term and no agreement to log


def _rows(run: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _num(row: dict[str, object], key: str) -> float:
    value = row.get(key, math.nan)
    return float(value) if isinstance(value, int | float | str) else math.nan


def _mean(values: list[float]) -> float:
    """Mean of ``values`` leaving out NaN (a step that lacks the metric)."""
    kept = [v for v in values if not math.isnan(v)]
    return sum(kept) / len(kept) if kept else math.nan


@dataclass(frozen=True)
class Curves:
    """One arm's per-RL-step series from its ``metrics.jsonl`` (NaN where a step lacks the metric)."""

    steps: list[int]
    truth: list[float]
    """``rollout/success``: the code-checked success of the step's own training episodes."""
    proxy: list[float]
    """The reward term the arm trains on (``reward/env`` for the code arm: the truth's own reward)."""
    agreement: list[float]
    """``reward/<term>_agreement`` with the checkers (NaN for the code arm: nothing to agree with)."""
    held_out: list[tuple[int, float]]
    """Held-out ``eval/success`` by step: before RL (step 0), at ``eval.every``, after RL."""
    held_out_n: list[int]
    """Episodes behind each held-out figure (``eval/episodes``; 0: not logged, no held-out trend)."""
    rows: list[dict[str, object]]


def curves(run: Path, arm: str) -> Curves:
    """The per-step series of the arm whose run folder is ``run``."""
    rows = _rows(run)
    rl = [r for r in rows if r["phase"] == "rl"]
    term = TERMS[arm]
    evals = [r for r in rows if "eval/success" in r]
    return Curves(
        steps=[int(_num(r, "step")) for r in rl],
        truth=[_num(r, "rollout/success") for r in rl],
        proxy=[_num(r, term) for r in rl],
        agreement=[_num(r, f"{term}_agreement") for r in rl],
        held_out=[(int(_num(r, "step")), _num(r, "eval/success")) for r in evals],
        held_out_n=[0 if math.isnan(n := _num(r, "eval/episodes")) else int(n) for r in evals],
        rows=rl,
    )


def summarize(c: Curves, arm: str, window: int) -> dict[str, object]:
    """One arm's figures: held-out success before and after, and over the first and last ``window`` RL steps the
    proxy's agreement, the proxy and the true train success, with the gaming verdict on those curves."""
    rl = c.rows or [{}]
    evals = c.held_out
    k = max(2, min(window, len(c.steps) // 2))  # < 4 steps: the verdict is "too short"
    n = c.held_out_n
    held = proportion_trend(evals[0][1], n[0], evals[-1][1], n[-1]) if len(evals) > 1 and min(n) > 0 else None
    verdict = gaming_verdict(c.proxy, c.truth, k, held_out=held) if arm != "code" else None
    return {
        "true_before": evals[0][1] if evals else math.nan,
        "true_after": evals[-1][1] if len(evals) > 1 else math.nan,  # nan: stopped before it
        "agree_start": _mean(c.agreement[:k]),
        "agree_end": _mean(c.agreement[-k:]),
        "proxy_start": _mean(c.proxy[:k]),
        "proxy_end": _mean(c.proxy[-k:]),
        "train_success_start": _mean(c.truth[:k]),
        "train_success_end": _mean(c.truth[-k:]),
        "truth_trend": f"{t.direction if (t := trend(c.truth, k)) else '—'} / {held.direction if held else '—'}",
        "proxy_trend": verdict.proxy.direction if verdict and verdict.proxy else "—",
        "gamed": verdict.verdict if verdict else "—",
        "s_per_step": _mean([_num(r, "time/step_s") for r in rl]),
        "rollout_s": _mean([_num(r, "time/rollout_s") for r in rl]),  # sampling and the reward terms' scoring
        "train_s": _mean([_num(r, "time/train_s") for r in rl]),
        "trained_per_step": _mean([_num(r, "train/episodes") for r in rl]),  # uniform groups are not trained on
        "judge_tokens_per_step": _mean([_num(r, "judge/tokens_per_episode") * _num(r, "rollout/episodes") for r in rl])
        if arm == "judge"
        else 0.0,
        "masked_per_step": sum(_num(r, "env/failure_reward_error") for r in rl if "env/failure_reward_error" in r)
        / len(rl),
        "steps": float(len(c.steps)),
        "window": float(k),
    }


def _rolling(xs: list[float], w: int) -> list[float]:
    """Trailing mean over up to ``w`` finite points (the curves' noise is per-step sampling)."""
    return [_mean(xs[max(0, i - w + 1) : i + 1]) for i in range(len(xs))]


def plot(arms: dict[str, Curves], verdicts: dict[str, str], window: int, path: Path) -> None:
    """Per arm (columns): true success and the proxy reward vs step (top), agreement with the checkers (bottom)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.2 * len(arms), 6.4), layout="constrained")
    axes = fig.subplots(2, len(arms), squeeze=False, sharex="col")
    for col, (arm, c) in enumerate(arms.items()):
        top, bottom = axes[0][col], axes[1][col]
        top.plot(c.steps, c.truth, color="tab:green", alpha=0.25, lw=0.8)
        top.plot(
            c.steps, _rolling(c.truth, window), color="tab:green", label=f"true success, train ({window}-step mean)"
        )
        if c.held_out:
            xs, ys = zip(*c.held_out, strict=True)
            top.plot(xs, ys, "o", color="black", label="true success, held-out")
        top.set_ylim(0, max(0.5, *[y for y in c.truth if not math.isnan(y)], 0))
        top.set_ylabel("success")
        top.set_title(f"{arm}: the truth (no proxy)" if arm == "code" else f"{arm}: {verdicts[arm]}", fontsize=10)
        if arm != "code":
            twin = top.twinx()
            twin.plot(c.steps, _rolling(c.proxy, window), color="tab:purple", label="proxy (same mean)")
            twin.set_ylabel(f"proxy {TERMS[arm]}", color="tab:purple")
            twin.legend(loc="lower right", fontsize=7)
        top.legend(loc="lower left", fontsize=7)
        bottom.axhline(0.5, color="grey", lw=0.6, ls="--")
        if arm == "code":
            bottom.text(0.5, 0.5, "the reward is the checkers:\nno agreement to measure", ha="center", va="center",
                        transform=bottom.transAxes, fontsize=8)  # fmt: skip
        else:
            bottom.plot(c.steps, c.agreement, color="tab:blue", alpha=0.25, lw=0.8)
            agree = f"agreement with the checkers ({window}-step mean)"
            bottom.plot(c.steps, _rolling(c.agreement, window), color="tab:blue", label=agree)
            bottom.legend(loc="lower left", fontsize=7)
        bottom.set_ylim(0, 1.02)
        bottom.set_xlabel("RL step")
        bottom.set_ylabel("pairwise agreement")
    fig.savefig(path, dpi=110)


def train_judge(warm: Path, pairs: Path, out: Path, steps: int, seed: int = 0) -> Path:
    """The warm start fine-tuned to grade (``--train-judge``): SFT on judge conversations whose verdict is the
    checkers' ``round(10 · met)`` for every answer of ``pairs``; saved to ``out``."""
    import random

    import torch

    from harmonyrl.harmony.codecs import load_codec
    from harmonyrl.models.tiny_gpt_oss import save_model
    from harmonyrl.rewards.config import DEFAULT_RUBRIC
    from harmonyrl.rewards.judge import judge_messages
    from harmonyrl.run.setup import load_for, setup_process
    from harmonyrl.sft.train import render_demo, sft_step
    from harmonyrl.types import Message

    if (out / "config.json").is_file():
        return out
    setup_process(seed, 1)
    tok = load_codec("harmonyrl_bpe")
    model = load_for(warm, tok)
    demos = []
    for line in pairs.read_text().splitlines():
        row = json.loads(line)
        for answer, met in ((row["chosen"], row["chosen_met"]), (row["rejected"], row["rejected_met"])):
            verdict = [Message(role="assistant", channel="final", content=str(round(10 * met)))]
            demos.append(render_demo(tok, judge_messages(DEFAULT_RUBRIC, 10, row["prompt"], answer), verdict))
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    model.train()
    for step in range(steps):
        loss = sft_step(model, optimizer, rng.sample(demos, 16), tok.special.endoftext)
        if step % 25 == 0:
            print(f"judge sft step {step}: loss {loss:.3f}", flush=True)
    save_model(model, out)
    return out


def _span(a: float, b: float, digits: int) -> str:
    """``a → b``, or ``—`` for a figure the arm does not have (the code arm's proxy and agreement)."""
    return "—" if math.isnan(a) and math.isnan(b) else f"{a:.{digits}f} → {b:.{digits}f}"


def table(results: dict[str, dict[str, object]]) -> list[str]:
    """The markdown table of the arms' figures."""
    lines = [
        "| arm | held-out true success before → after | agreement first → last | proxy first → last | true train "
        "success first → last | trend: proxy / truth (train / held-out) | gamed | s/step (rollout + scoring, "
        "update) | episodes trained/step | judge tokens/step | masked/step |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, r in results.items():
        f = {k: v for k, v in r.items() if isinstance(v, float)}
        lines.append(
            f"| {arm} | {_span(f['true_before'], f['true_after'], 3)} | {_span(f['agree_start'], f['agree_end'], 2)}"
            f" | {_span(f['proxy_start'], f['proxy_end'], 3)} | "
            f"{_span(f['train_success_start'], f['train_success_end'], 3)} | {r['proxy_trend']} / ({r['truth_trend']}) "
            f"| {r['gamed']} | {f['s_per_step']:.1f} ({f['rollout_s']:.1f}, {f['train_s']:.1f}) | "
            f"{f['trained_per_step']:.1f} | {f['judge_tokens_per_step']:.0f} | {f['masked_per_step']:.1f} |"
        )
    return lines


def run_arm(arm: str, common: list[str], rm: Path, judge: Path, run: Path) -> None:
    """Train one arm (skipped when its run folder already has a summary)."""
    if (run / "summary.json").is_file():
        return
    cmd = [sys.executable, "-m", "harmonyrl.cli", "train", *common, f"run_name={arm}", "--overwrite",
           *arm_overrides(arm, rm, judge)]  # fmt: skip
    done = subprocess.run(cmd, env=os.environ.copy())
    if done.returncode != 0 and not (run / "metrics.jsonl").is_file():
        raise SystemExit(f"arm {arm} failed before its first step (exit {done.returncode})")
    if done.returncode != 0:  # e.g. the fault breaker: a judge whose replies never parse masks every episode
        print(f"arm {arm} stopped early (exit {done.returncode}); its figures are up to where it stopped")


@dataclass(frozen=True)
class Inputs:
    """What every arm starts from: the policy's warm start, the reward model's folder, the judge's checkpoint."""

    warm: Path
    rm: Path
    judge: Path


def _cli(*args: str) -> None:
    """One ``harmonyrl`` command in a subprocess; a failure stops the benchmark with its exit status."""
    done = subprocess.run([sys.executable, "-m", "harmonyrl.cli", *args], env=os.environ.copy())
    if done.returncode != 0:
        raise SystemExit(f"harmonyrl {' '.join(args[:2])} failed (exit {done.returncode})")


PREPARE_SIZES = {"warm": 400, "prompts": 1600, "rm": 120, "judge": 150}
"""``--prepare``'s sizes: the documented inputs' (docs/rewards.md)."""


def prepare(out: Path) -> Inputs:
    """The documented inputs, made in ``out`` (each step skipped when its output is there: resumable): the micro
    instruct warm start, preference pairs from it, a reward model trained on them and the warm start fine-tuned to
    grade the same answers, at :data:`PREPARE_SIZES`. The commands are docs/rewards.md's."""
    sizes, gen = PREPARE_SIZES, ["env.name=instruct", "rollout.max_new_tokens=192", "threads=1"]
    warm = out / "warm" / "checkpoints" / "sft"
    if not (warm / "config.json").is_file():
        _cli("sft", *gen, "model.preset=micro", f"sft.steps={sizes['warm']}", "sft.batch_size=16",
             f"output_dir={out}", "run_name=warm", "--overwrite")  # fmt: skip
    pairs = out / "pairs.jsonl"
    if not pairs.is_file():  # written under another name first: a killed run leaves no half file behind
        part = out / "pairs.part.jsonl"
        _cli("rm", "pairs", "--checkpoint", str(warm), "--out", str(part), "--prompts", str(sizes["prompts"]), *gen)
        part.rename(pairs)
    rm = out / "rm"
    if not (rm / "checkpoint").is_dir():
        shutil.rmtree(rm, ignore_errors=True)  # a killed training's folder: rm train refuses to write over it
        every = max(1, sizes["rm"] // 3)
        _cli("rm", "train", f"data={pairs}", f"init_from={warm}", f"out={rm}", f"steps={sizes['rm']}",
             "batch_size=16", "lr=1e-4", "held_out=0.15", f"eval_every={every}", "threads=1")  # fmt: skip
    judge = train_judge(warm, pairs, out / "judge_checkpoint", sizes["judge"])
    return Inputs(warm, rm / "checkpoint", judge)


def _inputs(args: argparse.Namespace) -> Inputs:
    """``--prepare`` makes the inputs; otherwise ``--warm`` and ``--rm`` name them (the judge: ``--judge``, or
    ``--warm`` trained on ``--train-judge``, or ``--warm`` itself)."""
    if args.prepare:
        return prepare(args.out / "inputs")
    if args.warm is None or args.rm is None:
        raise SystemExit("rewards.py: give --warm and --rm, or --prepare to make them (docs/rewards.md)")
    judge = args.judge or args.warm
    if args.train_judge is not None:
        judge = train_judge(args.warm, args.train_judge, args.out / "judge_checkpoint", args.judge_steps)
    return Inputs(args.warm, args.rm, judge)


def pooled(per_seed: dict[int, dict[str, dict[str, object]]]) -> str:
    """The RESULT line's fields over seeds: per arm the held-out success after RL and its change (points), mean and
    standard error over seeds (:func:`harmonyrl.telemetry.stats.mean_se`), how many seeds called the proxy gamed, and
    the proxies' agreement at the end and the judge's seconds per step (means)."""
    from harmonyrl.telemetry.stats import mean_se

    def est(name: str, values: list[float], digits: int) -> str:  # seeds an arm stopped early on are left out
        return mean_se([v for v in values if not math.isnan(v)] or [math.nan]).fields(name, digits)

    seeds = sorted(per_seed)
    arms = [a for a in ("code", "rm", "judge") if all(a in per_seed[s] for s in seeds)]
    fields = []
    for arm in arms:
        rs = [per_seed[s][arm] for s in seeds]
        fields.append(est(f"{arm}_final", [float(str(r["true_after"])) for r in rs], 3))
        change = [100 * (float(str(r["true_after"])) - float(str(r["true_before"]))) for r in rs]
        fields.append(est(f"{arm}_change_pp", change, 1))
        if arm != "code":
            gamed = sum(r["gamed"] == "gamed" for r in rs)
            fields.append(f"{arm}_gamed={gamed} of {len(rs)}")
            fields.append(f"{arm}_agree_end={_mean([float(str(r['agree_end'])) for r in rs]):.3f}")
    if "judge" in arms:
        fields.append(f"judge_s_per_step={_mean([float(str(per_seed[s]['judge']['s_per_step'])) for s in seeds]):.1f}")
    return " ".join([*fields, f"seeds={','.join(map(str, seeds))}"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prepare", action="store_true", help="make the warm start, pairs, reward model and judge")
    parser.add_argument("--warm", type=Path, default=None, help="the shared warm start (a policy checkpoint)")
    parser.add_argument("--rm", type=Path, default=None, help="a reward model folder (harmonyrl rm train)")
    parser.add_argument("--judge", type=Path, default=None, help="the judge's checkpoint (default: --warm)")
    parser.add_argument("--train-judge", type=Path, default=None, help="pairs file: fine-tune --warm to grade on it")
    parser.add_argument("--judge-steps", type=int, default=150, help="SFT steps of --train-judge")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--seeds", default="0", help="comma-separated RL seeds (the inputs are shared by them)")
    parser.add_argument("--window", type=int, default=0, help="steps per first/last window (0: --steps / 4, min 2)")
    parser.add_argument("--out", type=Path, default=Path("runs/rewards-benchmark"))
    parser.add_argument("--arms", default="code,rm,judge")
    parser.add_argument("overrides", nargs="*", help="run overrides for every arm, e.g. eval.n_tasks=200")
    args = parser.parse_args()
    inputs = _inputs(args)
    common = [
        "env.name=instruct", f"model.init_from={inputs.warm}", "rollout.max_new_tokens=192", "rollout.tasks_per_step=4",
        "rollout.group_size=4", f"rl.steps={args.steps}", "eval.n_tasks=32", "eval.samples_per_task=2", "threads=1",
        "telemetry.record_rollouts=false", *args.overrides,
    ]  # fmt: skip
    window = args.window or max(2, args.steps // 4)
    seeds = [int(s) for s in args.seeds.split(",")]
    per_seed: dict[int, dict[str, dict[str, object]]] = {}
    lines: list[str] = []
    for seed in seeds:
        out = args.out / f"seed{seed}"
        arms: dict[str, Curves] = {}
        per_seed[seed] = {}
        for arm in args.arms.split(","):
            run_arm(arm, [*common, f"seed={seed}", f"output_dir={out}"], inputs.rm, inputs.judge, out / arm)
            arms[arm] = curves(out / arm, arm)
            per_seed[seed][arm] = summarize(arms[arm], arm, window)
        lines += [f"seed {seed}:", "", *table(per_seed[seed]), ""]
        plot(arms, {a: str(r["gamed"]) for a, r in per_seed[seed].items()}, window, out / "rewards.png")
        print(f"figure: {out / 'rewards.png'}")
    (args.out / "table.md").write_text("\n".join(lines))
    (args.out / "results.json").write_text(json.dumps(per_seed, indent=1, default=str))
    print("\n".join(lines))
    print("RESULT " + pooled(per_seed))


if __name__ == "__main__":
    main()
