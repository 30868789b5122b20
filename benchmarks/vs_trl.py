"""harmonyrl vs TRL's ``GRPOTrainer`` on the calculator task, from one warm start (issue 19, the TRL yardstick).

    python benchmarks/vs_trl.py [--seeds 0,1,2] [--steps 16] [--eval-every 4] [--target-gain 0.10]
                                [--warm SFT_CKPT] [--trl KEY=VALUE]... [--out DIR] [key=value ...]

One warm start (``harmonyrl sft``, or ``--warm``), then both trainers from it for each seed, in this one process,
with ``threads=1`` each, the arms interleaved A B B A … (seed 0: ours, TRL; seed 1: TRL, ours; …) so a drifting
load hits both alike: the same tasks in the same order, group size, batch, learning rate, AdamW betas, gradient
clip, clip range (0.2 / 0.28), token-mean loss, no KL, sampling temperature, per-turn and per-episode token budgets
and turn limit (settings: docs/vs_trl.md). harmonyrl runs its current defaults otherwise (attention kernel, engine
decode step, adaptive threads capped at 1). TRL runs its own multi-turn tool loop (``tools=[calculator]``) on
harmonyrl's rendered harmony prompt, and is rewarded by harmonyrl's environment replaying each completion
(:mod:`trl_adapter`). TRL's CPU settings: ``gradient_checkpointing=False`` (its default True is
slower and harmonyrl does not checkpoint), eager attention (the only transformers kernel with GPT-OSS sinks), fp32;
``--trl KEY=VALUE`` sets any other ``GRPOConfig`` field (e.g. ``use_transformers_paged=true``), and the settings
used are printed; TRL's vLLM generation is not available on this CPU.

One evaluator for both: harmonyrl's held-out evaluation (``eval.n_tasks`` tasks × ``eval.samples_per_task``
samples at T=1 → ``eval/success``, pass@1) every ``--eval-every`` steps, on the weights the trainer holds; its
time is left out of both clocks. Before training, TRL's own generation evaluates the warm start on the same
held-out tasks (``trainer.evaluate()``, rewarded by the same replay): it should agree with harmonyrl's figure within
sampling noise, which checks that TRL sees the task as harmonyrl does.

Time to target: the training seconds at which a trainer's held-out curve first reaches the target (the mean
warm-start pass@1 over every run + ``--target-gain``, or ``--target``), **interpolated** linearly between the two
evaluations around the crossing (:func:`harmonyrl.telemetry.stats.time_to_target`; reading the first evaluation at
or above it rounds both up to the evaluation interval, which skewed an earlier ratio by 12 vs 8 steps).

Reported per run: seconds per RL step, minutes to target, final pass@1 (± its task-clustered SE), the load average
around it. Over seeds (:mod:`harmonyrl.telemetry.stats`, arms paired by seed): the to-target speed-up (TRL minutes /
ours) and the per-step time ratio (TRL s/step / ours), each mean ± SE of the per-seed ratios, and the final pass@1
difference. Last line: ``RESULT trl_min_to_target=… ours_min_to_target=… speedup=… speedup_se=… step_ratio=…
step_ratio_se=… trl_final=… ours_final=… final_diff_pp=… final_diff_se=… target=… reached=ours:N/M,trl:N/M
seeds=…`` (``*_min_to_target`` and the finals are means over seeds; a seed where a trainer never reached the target
is left out of ``speedup`` and counted in ``reached``; ``speedup`` is ``none`` when no seed has both). ``--quick``:
one seed, a tiny model, 2 RL steps (a smoke test).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import json
import math
import os
import statistics
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from trl_adapter import HarmonyReward, prompt_messages, trl_tokenizer

from harmonyrl.algorithms.choices import PPOClip
from harmonyrl.config import RunConfig, load_config
from harmonyrl.harmony.codecs import load_codec
from harmonyrl.jobs.train import sft_only, train
from harmonyrl.run.setup import held_out_eval, held_out_tasks, make_engine, make_factory, setup_process
from harmonyrl.tasks.arith import calculator
from harmonyrl.telemetry.stats import over_seeds, paired, time_to_target

RL = [
    "model.preset=micro",
    "rollout.tasks_per_step=8",
    "rollout.group_size=8",
    "eval.n_tasks=64",
    "eval.samples_per_task=4",
    "threads=1",
]


@dataclass
class Arm:
    """One trainer's run: ``curve`` holds (RL step, training seconds so far, held-out pass@1) at each evaluation."""

    name: str
    curve: list[tuple[int, float, float]] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)
    load: str = ""
    notes: dict[str, float] = field(default_factory=dict)

    def minutes_to(self, target: float) -> float:
        """Training minutes at which the held-out curve reaches ``target``, interpolated; ``inf`` if never."""
        return time_to_target([(t, p) for _, t, p in self.curve], target) / 60

    @property
    def s_per_step(self) -> float:
        return sum(self.step_s) / max(len(self.step_s), 1)


def load_avg() -> str:
    return f"{os.getloadavg()[0]:.1f}"


# ---- harmonyrl ---------------------------------------------------------------------------------------


def run_ours(cfg: RunConfig, console: Console) -> Arm:
    """``harmonyrl train`` with ``eval.every``: its evaluations and ``time/step_s`` (rollout + update) are the curve."""
    arm = Arm("harmonyrl", load=load_avg())
    result = asyncio.run(train(cfg, console))
    arm.load += f"→{load_avg()}"
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    elapsed = 0.0
    for row in rows:
        if row["phase"] == "rl":
            arm.step_s.append(row["time/step_s"])
            elapsed += row["time/step_s"]
        if "eval/success" in row and row["phase"] in ("rl", "eval"):
            arm.curve.append((row["step"], elapsed, row["eval/success"]))
            arm.notes["final_se"] = row.get("eval/success_se", math.nan)
    rl = [r for r in rows if r["phase"] == "rl"]
    arm.notes |= {"reward_first": rl[0]["rollout/reward"], "reward_last": rl[-1]["rollout/reward"]}
    arm.notes["generate_s"] = sum(r["time/rollout_s"] for r in rl)  # episodes: generation, tools, reward, records
    return arm


# ---- TRL ---------------------------------------------------------------------------------------------


async def held_out_pass1(cfg: RunConfig, model: torch.nn.Module, arm: Arm) -> float:
    """harmonyrl's held-out evaluation (the one ``harmonyrl train`` runs) of ``model``'s current weights; its
    task-clustered SE goes to ``arm.notes["final_se"]`` (the last evaluation's stays)."""
    codec, factory = load_codec(cfg.model.tokenizer), make_factory(cfg)
    engine, limits = await make_engine(cfg, model, None)  # type: ignore[arg-type]
    try:
        metrics = await held_out_eval(cfg, engine, factory, codec, limits)()
    finally:
        await engine.close()
    arm.notes["final_se"] = float(metrics.get("eval/success_se", math.nan))
    return float(metrics["eval/success"])


def trl_args(cfg: RunConfig, out: Path, max_completion: int, extra: dict[str, Any] | None = None) -> Any:
    """GRPOConfig with harmonyrl's settings (see the module docstring), then ``extra`` (``--trl``)."""
    from trl import GRPOConfig

    r, loss = cfg.rollout, cfg.rl.loss
    assert isinstance(loss, PPOClip) and cfg.rl.epochs == cfg.rl.minibatches == 1
    return GRPOConfig(
        output_dir=str(out / "trl"),
        use_cpu=True,
        bf16=False,
        seed=cfg.seed,
        max_steps=cfg.rl.steps,
        learning_rate=cfg.rl.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        adam_beta1=0.9,
        adam_beta2=0.99,
        weight_decay=0.0,
        max_grad_norm=cfg.rl.max_grad_norm,
        per_device_train_batch_size=r.episodes_per_step,
        gradient_accumulation_steps=1,
        num_generations=r.group_size,
        per_device_eval_batch_size=8 * cfg.eval.samples_per_task,
        num_generations_eval=cfg.eval.samples_per_task,
        max_completion_length=max_completion,
        generation_kwargs={"max_new_tokens": r.max_new_tokens},
        max_tool_calling_iterations=r.max_turns - 1,
        temperature=r.temperature,
        top_p=r.top_p,
        top_k=r.top_k,
        beta=cfg.rl.kl.coef,
        epsilon=loss.clip_low,
        epsilon_high=loss.clip_high,
        loss_type="dapo",  # token-mean over the batch: harmonyrl's rl.aggregation=token-mean
        scale_rewards="group",
        router_aux_loss_coef=0.0,  # harmonyrl trains no load-balancing loss
        gradient_checkpointing=False,  # TRL's default is True; harmonyrl's model.gradient_checkpointing is false
        shuffle_dataset=False,  # the training split in order, as harmonyrl's task stream walks it
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        **(extra or {}),
    )


def held_out_callback(cfg: RunConfig, arm: Arm, every: int) -> Any:
    """A TrainerCallback timing each step and evaluating every ``every`` steps (evaluation off the clock)."""
    from transformers import TrainerCallback

    class HeldOut(TrainerCallback):  # type: ignore[misc]
        mark = 0.0

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.mark = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
            arm.step_s.append(time.perf_counter() - self.mark)
            step = state.global_step
            if step % every == 0 or step == cfg.rl.steps:
                arm.curve.append((step, sum(arm.step_s), asyncio.run(held_out_pass1(cfg, model, arm))))

    return HeldOut()


def build_trl(
    cfg: RunConfig, warm: Path, out: Path, arm: Arm, every: int, extra: dict[str, Any]
) -> tuple[Any, HarmonyReward]:
    """TRL's GRPOTrainer on ``warm`` with the calculator tool, harmonyrl's prompts and reward, and the callback."""
    try:
        from datasets import Dataset
        from transformers import AutoModelForCausalLM
        from trl import GRPOTrainer
    except ImportError:
        raise SystemExit("this benchmark needs TRL: pip install -c constraints-cpu.txt 'harmonyrl[trl]'") from None
    codec, factory = load_codec(cfg.model.tokenizer), make_factory(cfg)
    tokenizer = trl_tokenizer(warm)
    model = AutoModelForCausalLM.from_pretrained(warm, dtype=torch.float32, attn_implementation="eager")
    model.generation_config.eos_token_id = list(codec.special.stop_ids)  # a turn ends at <|call|> or <|return|>
    train_tasks = list(factory.tasks("train")[: cfg.rl.steps * cfg.rollout.tasks_per_step])
    test_tasks = list(held_out_tasks(cfg, factory))

    def rows(tasks: list[Any]) -> Any:
        return Dataset.from_list([{"prompt": asyncio.run(prompt_messages(factory, t)), "task_id": t.id} for t in tasks])

    train_set, test_set = rows(train_tasks), rows(test_tasks)
    render = functools.partial(tokenizer.apply_chat_template, add_generation_prompt=True, return_dict=False)
    budget = cfg.rollout.max_seq_len - max(len(render(p)) for p in train_set["prompt"])  # as max_seq_len bounds ours
    arm.notes["max_completion_length"] = budget
    reward = HarmonyReward(codec, factory, {t.id: t for t in [*train_tasks, *test_tasks]})
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[reward],
        args=trl_args(cfg, out, budget, extra),
        train_dataset=train_set,
        eval_dataset=test_set,
        processing_class=tokenizer,
        tools=[calculator],
        callbacks=[held_out_callback(cfg, arm, every)],
    )
    return trainer, reward


def time_generation(trainer: Any) -> list[float]:
    """Sum the seconds of TRL's generation with its tool loop (``_generate``) into the returned one-item list."""
    generate, spent = trainer._generate, [0.0]

    def timed_generate(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return generate(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - t

    trainer._generate = timed_generate
    return spent


def run_trl(cfg: RunConfig, warm: Path, out: Path, every: int, extra: dict[str, Any]) -> Arm:
    """TRL's GRPOTrainer from ``warm``: the warm start checked under TRL's generation, then ``rl.steps`` steps."""
    setup_process(cfg.seed, cfg.threads)
    arm = Arm("trl", load=load_avg())
    trainer, reward = build_trl(cfg, warm, out, arm, every, extra)
    check = trainer.evaluate()  # the warm start under TRL's own generation and tool loop
    arm.notes["warm_trl_generation"] = float(check["eval_reward"])
    arm.curve.append((0, 0.0, asyncio.run(held_out_pass1(cfg, trainer.model, arm))))
    spent = time_generation(trainer)
    trainer.train()
    arm.load += f"→{load_avg()}"
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h and "eval_reward" not in h]
    arm.notes |= {"reward_first": rewards[0], "reward_last": rewards[-1], "generate_s": spent[0]}
    arm.notes |= {"scored": reward.scored, "parity_failures": reward.parity_failures}
    return arm


# ---- report ------------------------------------------------------------------------------------------


def trl_extra(items: list[str]) -> dict[str, Any]:
    """``--trl KEY=VALUE`` as GRPOConfig keyword arguments (values parsed as YAML scalars: true, 0.5, text)."""
    import yaml

    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq:
            raise SystemExit(f"error: --trl {item}: expected KEY=VALUE")
        out[key] = yaml.safe_load(value)
    return out


def line(arm: Arm, seed: int, target: float) -> str:
    """One run's line: s/step, minutes to target, final pass@1 ± SE, load, the curve."""
    m = arm.minutes_to(target)
    where = f"{m:.2f} min" if math.isfinite(m) else "not reached"
    curve = " ".join(f"{s}:{p:.1%}" for s, _, p in arm.curve)
    se = arm.notes.get("final_se", math.nan)
    return (f"seed {seed} {arm.name:>9}  {arm.s_per_step:6.2f} s/step  to target: {where:<12} final "
            f"{arm.curve[-1][2]:.1%} ± {100 * se:.1f}  load {arm.load}  curve {curve}")  # fmt: skip


def result(runs: dict[int, dict[str, Arm]], target: float) -> str:
    """The RESULT line: means over seeds, ratios paired by seed (mean ± SE of the per-seed ratios)."""
    seeds = sorted(runs)
    ours = {s: runs[s]["harmonyrl"] for s in seeds}
    trl = {s: runs[s]["trl"] for s in seeds}
    ours_min = {s: a.minutes_to(target) for s, a in ours.items()}
    trl_min = {s: a.minutes_to(target) for s, a in trl.items()}
    both = [s for s in seeds if math.isfinite(ours_min[s]) and math.isfinite(trl_min[s]) and ours_min[s] > 0]
    speed = over_seeds({s: trl_min[s] / ours_min[s] for s in both}) if both else None
    step = over_seeds({s: trl[s].s_per_step / ours[s].s_per_step for s in seeds})
    final = paired({s: trl[s].curve[-1][2] for s in seeds}, {s: ours[s].curve[-1][2] for s in seeds})
    if len(seeds) == 1:  # one seed: the difference's SE from the two evaluations' own task-clustered SEs
        final = dataclasses.replace(final, se=math.hypot(ours[seeds[0]].notes["final_se"],
                                                         trl[seeds[0]].notes["final_se"]))  # fmt: skip

    def mean_min(mins: dict[int, float]) -> str:
        finite = [m for m in mins.values() if math.isfinite(m)]
        return f"{statistics.fmean(finite):.2f}" if finite else "none"

    reached = f"ours:{sum(map(math.isfinite, ours_min.values()))}/{len(seeds)},trl:" \
              f"{sum(map(math.isfinite, trl_min.values()))}/{len(seeds)}"  # fmt: skip
    return (
        f"RESULT trl_min_to_target={mean_min(trl_min)} ours_min_to_target={mean_min(ours_min)} "
        f"speedup={f'{speed.mean:.2f}' if speed else 'none'} speedup_se={speed.se if speed else math.nan:.2f} "
        f"step_ratio={step.mean:.2f} step_ratio_se={step.se:.2f} "
        f"trl_final={statistics.fmean(a.curve[-1][2] for a in trl.values()):.3f} "
        f"ours_final={statistics.fmean(a.curve[-1][2] for a in ours.values()):.3f} "
        f"final_diff_pp={100 * final.mean:.1f} final_diff_se={100 * final.se:.1f} target={target:.3f} "
        f"reached={reached} seeds={','.join(map(str, seeds))}"
    )


QUICK = ["model.preset=nano", "rollout.tasks_per_step=2", "rollout.group_size=2", "eval.n_tasks=4",
         "eval.samples_per_task=2"]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", default="0,1,2", help="RL seeds; each runs both trainers, A B B A interleaved")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--eval-every", type=int, default=4)
    parser.add_argument("--target", type=float, default=None, help="held-out pass@1 to reach (default: warm + gain)")
    parser.add_argument("--target-gain", type=float, default=0.10)
    parser.add_argument("--sft-steps", type=int, default=500)
    parser.add_argument("--warm", type=Path, default=None, help="reuse this warm start (an SFT checkpoint folder)")
    parser.add_argument("--trl", action="append", default=[], metavar="KEY=VALUE", help="another GRPOConfig setting")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--quick", action="store_true", help="one seed, tiny model, 2 RL steps: a smoke test")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.steps, args.eval_every, args.sft_steps = "0", 2, 1, 4
        args.overrides = [*QUICK, *args.overrides]
    # TRL toggles gradient checkpointing around every generation; transformers 5.24 warns about the old name each time
    warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*", category=FutureWarning)
    console = Console()
    extra = trl_extra(args.trl)
    out = args.out or Path(tempfile.mkdtemp(prefix="harmonyrl-vs-trl-"))
    if args.warm is None:
        sft = ["model.preset=micro", "threads=1", *args.overrides, f"sft.steps={args.sft_steps}"]
        args.warm = asyncio.run(sft_only(load_config(None, [*sft, f"output_dir={out}", "run_name=warm"]), console))
    print(f"TRL settings beyond the matched ones: gradient_checkpointing=False, eager attention, fp32 {extra or ''}")
    runs: dict[int, dict[str, Arm]] = {}
    for i, seed in enumerate(int(x) for x in args.seeds.split(",")):
        cfg = load_config(None, [*RL, *args.overrides, f"seed={seed}", f"rl.steps={args.steps}",
                                 f"eval.every={args.eval_every}", f"model.init_from={args.warm}", f"output_dir={out}",
                                 f"run_name=ours_s{seed}"])  # fmt: skip
        runs[seed] = {}
        for name in ("ours", "trl") if i % 2 == 0 else ("trl", "ours"):
            arm = run_ours(cfg, console) if name == "ours" else run_trl(cfg, args.warm, out / f"s{seed}",
                                                                         args.eval_every, extra)  # fmt: skip
            runs[seed][arm.name] = arm
            (out / "arms.json").write_text(json.dumps({s: {k: dataclasses.asdict(a) for k, a in r.items()}
                                                       for s, r in runs.items()}, indent=1))  # fmt: skip
    starts = [a.curve[0][2] for r in runs.values() for a in r.values()]
    target = args.target if args.target is not None else statistics.fmean(starts) + args.target_gain
    print(f"target {target:.1%} (mean warm-start pass@1 {statistics.fmean(starts):.1%} + {args.target_gain:.0%})")
    for seed, r in runs.items():
        ours, trl = r["harmonyrl"], r["trl"]
        same = trl.notes["scored"] - trl.notes["parity_failures"]
        print(f"seed {seed}: warm start, held-out pass@1 (harmonyrl evaluator): harmonyrl {ours.curve[0][2]:.1%}, TRL "
              f"model {trl.curve[0][2]:.1%}; under TRL's own generation: {trl.notes['warm_trl_generation']:.1%}; TRL "
              f"max_completion_length {trl.notes['max_completion_length']:.0f}; TRL tool results equal to the agent "
              f"loop's: {same:.0f}/{trl.notes['scored']:.0f}")  # fmt: skip
        for arm in (ours, trl):
            print(line(arm, seed, target))
            gen = arm.notes["generate_s"] / len(arm.step_s)
            print(f"    train reward {arm.notes['reward_first']:.3f} → {arm.notes['reward_last']:.3f}; per step "
                  f"{gen:.2f} s generating episodes, {arm.s_per_step - gen:.2f} s the rest")  # fmt: skip
    print(result(runs, target))


if __name__ == "__main__":
    main()
