"""How far the full distillation term moves a student on one fixed batch of its own episodes, per learning rate.

    python benchmarks/distill_step_probe.py --student W --teacher T [--lr 1e-4] [--steps 5] [--seed 0]

Samples 4 × 8 episodes (``benchmarks/distill.py``'s batch) of the first train tasks from the student
``W`` at T = 1, then runs ``--steps`` updates of ``rl.distill.kind=full`` alone (``env_reward=false``, AdamW as the
learner builds it) on that same batch, printing the exact reverse KL to the teacher ``T`` on the batch's sampled
positions after each. Last line: ``RESULT lr=… kl_before=… kl_after_1=… kl_after=…``. docs/distill.md reads it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import distill  # benchmarks/distill.py: its sampler

from harmonyrl.algorithms.distill import full_reverse_kl
from harmonyrl.config import load_config
from harmonyrl.harmony.codecs import load_codec
from harmonyrl.learn.batch import Batch, collate, score
from harmonyrl.models.load import load_checkpoint
from harmonyrl.rl.targets import Prepared
from harmonyrl.rl.update import rl_update
from harmonyrl.run.setup import setup_process


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--student", type=Path, required=True)
    p.add_argument("--teacher", type=Path, required=True)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    cfg = load_config(None, [f"model.init_from={args.student}", "sft.steps=0", f"seed={args.seed}", "threads=2",
                             "rollout.tasks_per_step=4", "rollout.group_size=8",
                             f"rl.distill.teacher={args.teacher}", "rl.distill.kind=full",
                             "rl.distill.env_reward=false", f"rl.lr={args.lr}"])  # fmt: skip
    setup_process(cfg.seed, cfg.threads)
    tok = load_codec(cfg.model.tokenizer)
    # the student's own episodes, sampled as distill.py samples a teacher's (every one kept, faults excepted)
    episodes = asyncio.run(distill._teacher_samples(cfg, args.student, 1, successes_only=False))
    batch = collate(episodes, tok.special.endoftext)
    cpu = torch.device("cpu")
    student = load_checkpoint(args.student, dtype=torch.float32, device=cpu).eval()
    teacher = load_checkpoint(args.teacher, dtype=torch.float32, device=cpu).eval()
    opt = torch.optim.AdamW(student.parameters(), lr=cfg.rl.lr, weight_decay=0.0, betas=(0.9, 0.99))
    kls = [_kl(student, teacher, batch)]
    print(f"lr {args.lr:g}: reverse KL on the batch {kls[0]:.4f} ({int(batch.loss_mask.sum())} sampled tokens)")
    for step in range(1, args.steps + 1):
        rl_update(student, opt, Prepared(batch, 0, 0), cfg.rl, None, teacher=teacher)
        kls.append(_kl(student, teacher, batch))
        print(f"after step {step}: {kls[-1]:.4f}")
    print(f"RESULT lr={args.lr:g} kl_before={kls[0]:.4f} kl_after_1={kls[1]:.4f} kl_after={kls[-1]:.4f}")


def _kl(student: torch.nn.Module, teacher: torch.nn.Module, batch: Batch) -> float:
    with torch.no_grad():
        s = score(student, batch.input_ids, batch.attention_mask, keep_logits=True).logits
        t = score(teacher, batch.input_ids, batch.attention_mask, keep_logits=True).logits
    assert s is not None and t is not None
    return float(full_reverse_kl(s, t)[batch.loss_mask.bool()].mean())


if __name__ == "__main__":
    main()
