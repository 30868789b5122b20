"""``harmonyrl rm train``: a Bradley–Terry reward model on preference pairs, top to bottom.

Pairs are split by prompt (every pair of a held-out prompt is held out, so no answer to a held-out prompt is trained
on). Each step takes ``batch_size`` pairs in seeded epochs, scores chosen and rejected in one padded forward and
minimises ``−log σ(r_c − r_r − margin)`` (+ centring). Every ``eval_every`` steps and at the end the held-out pairs
give ``rm_eval/accuracy`` (chosen scored strictly higher), ``rm_eval/ece`` (calibration of σ(r_c − r_r)),
``rm_eval/loss`` and ``rm_eval/reward_mean`` in ``metrics.jsonl``. The checkpoint is written to ``OUT/checkpoint``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

from harmonyrl.algorithms.preference import bradley_terry_loss, expected_calibration_error, pairwise_accuracy
from harmonyrl.harmony.codecs import load_codec, vocab_mismatch
from harmonyrl.learn.optimizer_step import GuardFigures, optimizer_step
from harmonyrl.models.tiny_gpt_oss import build_config, build_model
from harmonyrl.rewards.config import RMTrainConfig
from harmonyrl.rewards.model import RewardModel, answer_ids, save_reward_model
from harmonyrl.rewards.pair_files import PairFile, read_pairs
from harmonyrl.rewards.pairs import Pair
from harmonyrl.run.setup import load_for, setup_process
from harmonyrl.telemetry.metrics import JsonlWriter


@dataclass(frozen=True)
class Encoded:
    """One pair as the reward model reads it."""

    chosen: list[int]
    rejected: list[int]
    margin: float


@dataclass(frozen=True)
class RMResult:
    checkpoint: Path
    train_pairs: int
    held_out_pairs: int
    accuracy: float
    """Held-out pairwise accuracy at the end."""
    ece: float
    skipped: int


def split_by_prompt(pairs: Sequence[Pair], held_out: float, seed: int) -> tuple[list[Pair], list[Pair]]:
    """(train, held-out): a seeded ``held_out`` fraction of the distinct prompts (at least one, and at least one left
    to train on when there are two or more) with all their pairs."""
    prompts = sorted({p.prompt for p in pairs}, key=repr)
    random.Random(seed).shuffle(prompts)
    n = min(max(1, round(held_out * len(prompts))), max(len(prompts) - 1, 1))
    test = set(prompts[:n])
    return [p for p in pairs if p.prompt not in test], [p for p in pairs if p.prompt in test]


def _start_model(cfg: RMTrainConfig) -> RewardModel:
    tok = load_codec(cfg.tokenizer)
    if cfg.init_from is not None:
        lm = load_for(cfg.init_from, tok)
    else:
        special = tok.special
        mcfg = build_config(cfg.preset, tok.vocab_size, special.endoftext, special.return_, max(1024, cfg.max_len))
        lm = build_model(mcfg, seed=cfg.seed)
    if (mismatch := vocab_mismatch("the trunk", int(lm.config.vocab_size), tok)) is not None:
        raise ValueError(mismatch)
    return RewardModel(lm, cfg.tokenizer, cfg.max_len, seed=cfg.seed)


def _scores(rm: RewardModel, pairs: Sequence[Encoded]) -> tuple[torch.Tensor, torch.Tensor]:
    """(r_chosen, r_rejected) ``[B]`` in one padded forward."""
    ids, mask = rm.batch([p.chosen for p in pairs] + [p.rejected for p in pairs])
    scores = rm(ids, mask)
    return scores[: len(pairs)], scores[len(pairs) :]


def held_out_metrics(rm: RewardModel, pairs: Sequence[Encoded], centring: float, batch: int) -> dict[str, float]:
    """``rm_eval/*`` over ``pairs``, scored in eval mode without gradients."""
    rm.eval()
    chosen, rejected = [], []
    with torch.no_grad():
        for start in range(0, len(pairs), batch):
            c, r = _scores(rm, pairs[start : start + batch])
            chosen.append(c)
            rejected.append(r)
    rm.train()
    rc, rr = torch.cat(chosen), torch.cat(rejected)
    margin = torch.tensor([p.margin for p in pairs])
    return {
        "rm_eval/accuracy": pairwise_accuracy(rc, rr),
        "rm_eval/ece": expected_calibration_error(torch.sigmoid(rc - rr)),
        "rm_eval/loss": float(bradley_terry_loss(rc, rr, margin, centring)),
        "rm_eval/reward_mean": float(torch.cat([rc, rr]).mean()),
        "rm_eval/pairs": float(len(pairs)),
    }


def _batches(n: int, size: int, seed: int) -> Callable[[], list[int]]:
    """Indices of the next batch, drawn without replacement in seeded epochs."""
    rng, queue = random.Random(seed), list[int]()

    def next_batch() -> list[int]:
        while len(queue) < size:
            epoch = list(range(n))
            rng.shuffle(epoch)
            queue.extend(epoch)
        out = queue[:size]
        del queue[:size]
        return out

    return next_batch


def train_reward_model(cfg: RMTrainConfig, loaded: PairFile | None = None) -> RMResult:
    """Train, evaluate and save; ``loaded`` are pairs already read (default: :attr:`RMTrainConfig.data`)."""
    setup_process(cfg.seed, cfg.threads)
    loaded = loaded if loaded is not None else read_pairs(cfg.data)
    train, test = split_by_prompt(loaded.pairs, cfg.held_out, cfg.seed)
    if not train:
        raise ValueError(f"'{cfg.data}' has pairs for one prompt only: none left to train on after the held-out split")
    cfg.out.mkdir(parents=True, exist_ok=False)
    (cfg.out / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    rm = _start_model(cfg)
    tok = load_codec(cfg.tokenizer)

    def encode(pairs: list[Pair]) -> list[Encoded]:
        return [Encoded(answer_ids(tok, p.prompt, p.chosen, cfg.max_len), answer_ids(tok, p.prompt, p.rejected,
                cfg.max_len), p.margin) for p in pairs]  # fmt: skip

    train_enc, test_enc = encode(train), encode(test)
    writer = JsonlWriter(cfg.out / "metrics.jsonl")
    writer.write(0, {"rm/train_pairs": float(len(train)), "rm/held_out_pairs": float(len(test)),
                   "rm/skipped_rows": float(len(loaded.issues))}, "rm")  # fmt: skip
    writer.write(0, held_out_metrics(rm, test_enc, cfg.centring, cfg.batch_size), "rm_eval")
    optimizer = torch.optim.AdamW(rm.parameters(), lr=cfg.lr, weight_decay=0.0)
    next_batch = _batches(len(train_enc), min(cfg.batch_size, len(train_enc)), cfg.seed)
    rm.train()
    for step in range(1, cfg.steps + 1):
        batch = [train_enc[i] for i in next_batch()]
        seen: dict[str, float] = {}

        def backward(batch: list[Encoded] = batch, seen: dict[str, float] = seen) -> GuardFigures:
            chosen, rejected = _scores(rm, batch)
            loss = bradley_terry_loss(chosen, rejected, torch.tensor([p.margin for p in batch]), cfg.centring)
            loss.backward()
            seen |= {
                "rm/loss": float(loss.detach()),
                "rm/accuracy": pairwise_accuracy(chosen.detach(), rejected.detach()),
            }
            return GuardFigures(seen["rm/loss"])

        outcome = optimizer_step(optimizer, list(rm.parameters()), backward, cfg.max_grad_norm)
        writer.write(step, seen | {"rm/grad_norm": outcome.grad_norm}, "rm")
        if step % cfg.eval_every == 0 or step == cfg.steps:
            final = held_out_metrics(rm, test_enc, cfg.centring, cfg.batch_size)
            writer.write(step, final, "rm_eval")
    writer.close()
    path = save_reward_model(rm, cfg.out / "checkpoint")
    result = RMResult(path, len(train), len(test), final["rm_eval/accuracy"], final["rm_eval/ece"], len(loaded.issues))
    summary = {k: (str(v) if isinstance(v, Path) else v) for k, v in result.__dict__.items()}
    (cfg.out / "summary.json").write_text(json.dumps(summary, indent=2))
    return result
