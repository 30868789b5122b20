"""harmonyrl vs TRL's ``GRPOTrainer`` on the calculator task, from one warm start (issue 19, the TRL yardstick).

    python benchmarks/vs_trl.py [--steps 16] [--eval-every 4] [--target-gain 0.10] [--warm SFT_CKPT]
                                [--order ours,trl] [--out DIR] [key=value ...]

One warm start (``harmonyrl sft``, or ``--warm``), then both trainers from it, one after the other in this process,
with ``threads=1`` each: the same tasks in the same order, group size, batch, learning rate, AdamW betas, gradient
clip, clip range (0.2 / 0.28), token-mean loss, no KL, sampling temperature, per-turn and per-episode token budgets
and turn limit (settings: docs/vs_trl.md). TRL runs its own multi-turn tool loop (``tools=[calculator]``) on
harmonyrl's rendered harmony prompt, and is rewarded by harmonyrl's environment replaying each completion
(:mod:`harmonyrl.trainer.trl_adapter`).

One evaluator for both: harmonyrl's held-out evaluation (``eval.n_tasks`` tasks × ``eval.samples_per_task``
samples at T=1 → ``eval/success``, pass@1) every ``--eval-every`` steps, on the weights the trainer holds; its
time is left out of both clocks. Before training, TRL's own generation evaluates the warm start on the same
held-out tasks (``trainer.evaluate()``, rewarded by the same replay): it should agree with harmonyrl's figure within
sampling noise, which checks that TRL sees the task as harmonyrl does.

Reported per trainer: seconds per RL step, training seconds to the first evaluation at or above the target
(warm-start pass@1 + ``--target-gain``, or ``--target``), final pass@1, the load average around the run. Last line:
``RESULT trl_min_to_target=… ours_min_to_target=… speedup=… trl_final=… ours_final=…`` (a trainer that does not
reach the target shows ``none``, and ``speedup`` is then a bound, ``>x``, from its whole training time).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import json
import os
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from harmonyrl.algorithms.choices import PPOClip
from harmonyrl.config import RunConfig, load_config
from harmonyrl.harmony.codecs import load_codec
from harmonyrl.tasks.arith import calculator
from harmonyrl.trainer.loop import sft_only, train
from harmonyrl.trainer.setup import held_out_eval, held_out_tasks, make_engine, make_factory, setup_process
from harmonyrl.trainer.trl_adapter import HarmonyReward, prompt_messages, trl_tokenizer

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

    def reached(self, target: float) -> tuple[int, float] | None:
        """(step, seconds) of the first evaluation at or above ``target``."""
        return next(((s, t) for s, t, p in self.curve if p >= target), None)


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
    rl = [r for r in rows if r["phase"] == "rl"]
    arm.notes |= {"reward_first": rl[0]["rollout/reward"], "reward_last": rl[-1]["rollout/reward"]}
    arm.notes["generate_s"] = sum(r["time/rollout_s"] for r in rl)  # episodes: generation, tools, reward, records
    return arm


# ---- TRL ---------------------------------------------------------------------------------------------


async def held_out_pass1(cfg: RunConfig, model: torch.nn.Module) -> float:
    """harmonyrl's held-out evaluation (the one ``harmonyrl train`` runs) of ``model``'s current weights."""
    codec, factory = load_codec(cfg.model.tokenizer), make_factory(cfg)
    engine, limits = await make_engine(cfg, model, None)  # type: ignore[arg-type]
    try:
        metrics = await held_out_eval(cfg, engine, factory, codec, limits)()
    finally:
        await engine.close()
    return float(metrics["eval/success"])


def trl_args(cfg: RunConfig, out: Path, max_completion: int) -> Any:
    """GRPOConfig with harmonyrl's settings (see the module docstring)."""
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
                arm.curve.append((step, sum(arm.step_s), asyncio.run(held_out_pass1(cfg, model))))

    return HeldOut()


def build_trl(cfg: RunConfig, warm: Path, out: Path, arm: Arm, every: int) -> tuple[Any, HarmonyReward]:
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
        args=trl_args(cfg, out, budget),
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


def run_trl(cfg: RunConfig, warm: Path, out: Path, every: int) -> Arm:
    """TRL's GRPOTrainer from ``warm``: the warm start checked under TRL's generation, then ``rl.steps`` steps."""
    setup_process(cfg.seed, cfg.threads)
    arm = Arm("trl", load=load_avg())
    trainer, reward = build_trl(cfg, warm, out, arm, every)
    check = trainer.evaluate()  # the warm start under TRL's own generation and tool loop
    arm.notes["warm_trl_generation"] = float(check["eval_reward"])
    arm.curve.append((0, 0.0, asyncio.run(held_out_pass1(cfg, trainer.model))))
    spent = time_generation(trainer)
    trainer.train()
    arm.load += f"→{load_avg()}"
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h and "eval_reward" not in h]
    arm.notes |= {"reward_first": rewards[0], "reward_last": rewards[-1], "generate_s": spent[0]}
    arm.notes |= {"scored": reward.scored, "parity_failures": reward.parity_failures}
    return arm


# ---- report ------------------------------------------------------------------------------------------


def summary(arm: Arm, target: float) -> tuple[str, float | None]:
    hit = arm.reached(target)
    best = max(arm.curve, key=lambda c: c[2])
    s_per_step = sum(arm.step_s) / max(len(arm.step_s), 1)
    where = f"step {hit[0]}, {hit[1] / 60:.2f} min" if hit else f"not reached (best {best[2]:.1%} at step {best[0]})"
    curve = " ".join(f"{s}:{p:.1%}" for s, _, p in arm.curve)
    line = (f"{arm.name:>9}  {s_per_step:6.2f} s/step  target: {where:<36} final {arm.curve[-1][2]:.1%}  "
            f"load {arm.load}  curve {curve}")  # fmt: skip
    return line, hit[1] / 60 if hit else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--eval-every", type=int, default=4)
    parser.add_argument("--target", type=float, default=None, help="held-out pass@1 to reach (default: warm + gain)")
    parser.add_argument("--target-gain", type=float, default=0.10)
    parser.add_argument("--sft-steps", type=int, default=500)
    parser.add_argument("--warm", type=Path, default=None, help="reuse this warm start (an SFT checkpoint folder)")
    parser.add_argument("--order", default="ours,trl")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    # TRL toggles gradient checkpointing around every generation; transformers 5.24 warns about the old name each time
    warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*", category=FutureWarning)
    console = Console()
    out = args.out or Path(tempfile.mkdtemp(prefix="harmonyrl-vs-trl-"))
    if args.warm is None:
        sft = ["model.preset=micro", "threads=1", *args.overrides, f"sft.steps={args.sft_steps}"]
        args.warm = asyncio.run(sft_only(load_config(None, [*sft, f"output_dir={out}", "run_name=warm"]), console))
    cfg = load_config(None, [*RL, *args.overrides, f"rl.steps={args.steps}", f"eval.every={args.eval_every}",
                             f"model.init_from={args.warm}", f"output_dir={out}", "run_name=ours"])  # fmt: skip
    arms: dict[str, Arm] = {}
    for name in args.order.split(","):
        arms[name] = run_ours(cfg, console) if name == "ours" else run_trl(cfg, args.warm, out, args.eval_every)
    (out / "arms.json").write_text(json.dumps({k: dataclasses.asdict(a) for k, a in arms.items()}, indent=1))
    ours, trl = arms["ours"], arms["trl"]
    target = args.target if args.target is not None else ours.curve[0][2] + args.target_gain
    same = trl.notes["scored"] - trl.notes["parity_failures"]
    print(f"warm start, held-out pass@1 (harmonyrl evaluator): harmonyrl {ours.curve[0][2]:.1%}, TRL model "
          f"{trl.curve[0][2]:.1%}; under TRL's own generation: {trl.notes['warm_trl_generation']:.1%}")  # fmt: skip
    print(f"TRL max_completion_length {trl.notes['max_completion_length']:.0f}")
    print(f"target {target:.1%}; TRL tool results equal to the agent loop's: {same:.0f}/{trl.notes['scored']:.0f}")
    (ours_line, ours_min), (trl_line, trl_min) = summary(ours, target), summary(trl, target)
    print(ours_line, trl_line, sep="\n")
    for arm in (ours, trl):
        gen, step = arm.notes["generate_s"] / len(arm.step_s), sum(arm.step_s) / len(arm.step_s)
        print(f"{arm.name}: train reward {arm.notes['reward_first']:.3f} → {arm.notes['reward_last']:.3f}; "
              f"per step {gen:.2f} s generating episodes, {step - gen:.2f} s the rest")  # fmt: skip
    if ours_min and trl_min:
        speedup = f"{trl_min / ours_min:.2f}"
    elif ours_min:
        speedup = f">{sum(trl.step_s) / 60 / ours_min:.2f}"
    else:
        speedup = "none"
    fmt = lambda m: "none" if m is None else f"{m:.2f}"  # noqa: E731
    per_step = {a.name: sum(a.step_s) / len(a.step_s) for a in (ours, trl)}
    print(f"RESULT trl_min_to_target={fmt(trl_min)} ours_min_to_target={fmt(ours_min)} speedup={speedup} "
          f"trl_final={trl.curve[-1][2]:.3f} ours_final={ours.curve[-1][2]:.3f} target={target:.3f} "
          f"trl_s_per_step={per_step['trl']:.2f} ours_s_per_step={per_step['harmonyrl']:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
