"""Code-checked reward vs a learned reward model vs an LLM judge: the instruct env trained three ways from one warm
start, same budget (docs/rewards.md).

    python benchmarks/rewards.py --warm RUN/checkpoints/sft --rm RM/checkpoint [--steps 6] [key=value ...]

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
ranks the same way) on the first and last step, the proxy reward and the true train success on the first and last
step (the proxy rising while true success falls is the policy gaming it), seconds per step and judge tokens per
step; "first" and "last" are means over the first and last 5 RL steps. Last line:
``RESULT code_final=… rm_final=… judge_final=… rm_agree_end=… judge_agree_end=… judge_s_per_step=…``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

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


def _window(rows: list[dict[str, object]], key: str) -> float:
    """Mean of ``key`` over ``rows``, leaving out steps that lack it or logged NaN."""
    values = [v for v in (_num(r, key) for r in rows) if not math.isnan(v)]
    return sum(values) / len(values) if values else math.nan


def summarize(run: Path, arm: str, window: int = 5) -> dict[str, float]:
    """One arm's figures from its ``metrics.jsonl``; "start" and "end" are means over the first and last ``window``
    RL steps (one step's 16 episodes are too few to read alone)."""
    rows = _rows(run)
    evals = [r for r in rows if r["phase"] == "eval"]
    rl = [r for r in rows if r["phase"] == "rl"] or [{}]
    k = max(1, min(window, len(rl) // 2))
    first, last = rl[:k], rl[-k:]
    term = TERMS[arm]
    return {
        "true_before": _num(evals[0], "eval/success"),
        "true_after": _num(evals[-1], "eval/success") if len(evals) > 1 else math.nan,  # nan: stopped before it
        "agree_start": _window(first, f"{term}_agreement"),
        "agree_end": _window(last, f"{term}_agreement"),
        "proxy_start": _window(first, term),
        "proxy_end": _window(last, term),
        "train_success_start": _window(first, "rollout/success"),
        "train_success_end": _window(last, "rollout/success"),
        "s_per_step": _window(rl, "time/step_s"),
        "judge_tokens_per_step": _window(rl, "judge/tokens_per_episode") * _window(rl, "rollout/episodes")
        if arm == "judge"
        else 0.0,
        "masked_per_step": sum(_num(r, "env/failure_reward_error") for r in rl if "env/failure_reward_error" in r)
        / len(rl),
        "steps": float(len([r for r in rl if r])),
    }


def gamed(r: dict[str, float]) -> str:
    """``yes`` when the proxy rose while true train success fell from the first steps to the last."""
    if math.isnan(r["proxy_start"]) or math.isnan(r["proxy_end"]):
        return "—"
    return "yes" if r["proxy_end"] > r["proxy_start"] and r["train_success_end"] < r["train_success_start"] else "no"


def train_judge(warm: Path, pairs: Path, out: Path, steps: int, seed: int = 0) -> Path:
    """The warm start fine-tuned to grade (``--train-judge``): SFT on judge conversations whose verdict is the
    checkers' ``round(10 · met)`` for every answer of ``pairs``; saved to ``out``."""
    import random

    import torch

    from harmonyrl.harmony.codecs import load_codec
    from harmonyrl.models.tiny_gpt_oss import save_model
    from harmonyrl.rewards.config import DEFAULT_RUBRIC
    from harmonyrl.rewards.judge import judge_messages
    from harmonyrl.trainer.setup import load_for, setup_process
    from harmonyrl.trainer.sft import render_demo, sft_step
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--warm", type=Path, required=True, help="the shared warm start (a policy checkpoint)")
    parser.add_argument("--rm", type=Path, required=True, help="a reward model folder (harmonyrl rm train)")
    parser.add_argument("--judge", type=Path, default=None, help="the judge's checkpoint (default: --warm)")
    parser.add_argument("--train-judge", type=Path, default=None, help="pairs file: fine-tune --warm to grade on it")
    parser.add_argument("--judge-steps", type=int, default=150, help="SFT steps of --train-judge")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out", type=Path, default=Path("runs/rewards-benchmark"))
    parser.add_argument("--arms", default="code,rm,judge")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    common = [
        "env.name=instruct", f"model.init_from={args.warm}", "rollout.max_new_tokens=192", "rollout.tasks_per_step=4",
        "rollout.group_size=4", f"rl.steps={args.steps}", "eval.n_tasks=32", "eval.samples_per_task=2", "threads=1",
        "telemetry.record_rollouts=false", f"output_dir={args.out}", *args.overrides,
    ]  # fmt: skip
    judge = args.judge or args.warm
    if args.train_judge is not None:
        judge = train_judge(args.warm, args.train_judge, args.out / "judge_checkpoint", args.judge_steps)
    results: dict[str, dict[str, float]] = {}
    for arm in args.arms.split(","):
        run = args.out / arm
        if not (run / "summary.json").is_file():
            cmd = [sys.executable, "-m", "harmonyrl.cli", "train", *common, f"run_name={arm}", "--overwrite",
                   *arm_overrides(arm, args.rm, judge)]  # fmt: skip
            done = subprocess.run(cmd, env=os.environ.copy())
            if done.returncode != 0 and not (run / "metrics.jsonl").is_file():
                raise SystemExit(f"arm {arm} failed before its first step (exit {done.returncode})")
            if done.returncode != 0:  # e.g. the fault breaker: a judge whose replies never parse masks every episode
                print(f"arm {arm} stopped early (exit {done.returncode}); its figures are up to where it stopped")
        results[arm] = summarize(run, arm)
    print("| arm | true success before → after | agreement start → end | proxy start → end | train success "
          "start → end | gamed | s/step | judge tokens/step | masked/step |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for arm, r in results.items():
        print(f"| {arm} | {r['true_before']:.3f} → {r['true_after']:.3f} | {r['agree_start']:.2f} → "
              f"{r['agree_end']:.2f} | {r['proxy_start']:.3f} → {r['proxy_end']:.3f} | "
              f"{r['train_success_start']:.3f} → {r['train_success_end']:.3f} | {gamed(r)} | {r['s_per_step']:.1f} | "
              f"{r['judge_tokens_per_step']:.0f} | {r['masked_per_step']:.1f} |")  # fmt: skip
    nan = {"true_after": math.nan, "agree_end": math.nan, "s_per_step": math.nan}
    c, m, j = (results.get(a, nan) for a in ("code", "rm", "judge"))
    print(f"RESULT code_final={c['true_after']:.3f} rm_final={m['true_after']:.3f} judge_final={j['true_after']:.3f} "
          f"rm_agree_end={m['agree_end']:.3f} judge_agree_end={j['agree_end']:.3f} "
          f"judge_s_per_step={j['s_per_step']:.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
