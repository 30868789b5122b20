"""Does a calculator warm start copy numbers yet? A teacher-forced probe of a checkpoint, in seconds.

    python benchmarks/copy_probe.py CHECKPOINT [--n 24] [key=value ...]

The scripted expert's demonstration of each of the first ``--n`` held-out tasks (tool call, tool result, bare
answer: ``p_tool=1``, ``p_verbose=0``) is fed to the model; at every position the model writes, its argmax is
compared with the demonstration. The calculator is deterministic, so a completion whose every token is the argmax
is exactly what greedy decoding writes: "all right" is greedy success without decoding. "Numbers right" counts the
number tokens, the ones a model must copy (from the prompt into the tool call, from the tool result into the answer).
The env, tokenizer and seed are the checkpoint's own (its ``harmonyrl_config.yaml``; ``key=value`` on top).
Last line: ``RESULT demos=… number_tokens=… numbers_right=… all_right=…``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from harmonyrl.config import load_config
from harmonyrl.harmony.codecs import load_codec
from harmonyrl.models.tiny_gpt_oss import load_model
from harmonyrl.tasks.calculator import expert_demo
from harmonyrl.tasks.factory import make_factory
from harmonyrl.trainer.checkpoint_files import RUN_CONFIG_FILE
from harmonyrl.trainer.sft import Demo, build_demos


def tally(predicted: Sequence[int], demo: Demo, is_number: Callable[[int], bool]) -> tuple[int, int, bool]:
    """(number tokens right, number tokens, every written token right) for one demonstration:
    ``predicted[t]`` is the model's argmax after ``demo.ids[: t + 1]``; written tokens are those with mask 1."""
    right = total = 0
    all_right = True
    for t in range(1, len(demo.ids)):
        if not demo.mask[t]:
            continue
        good = predicted[t - 1] == demo.ids[t]
        all_right &= good
        if is_number(demo.ids[t]):
            total += 1
            right += good
    return right, total, all_right


@torch.no_grad()
def argmax_next(model: torch.nn.Module, ids: Sequence[int]) -> list[int]:
    """The model's argmax next token after each prefix of ``ids`` (one forward pass)."""
    logits = model(input_ids=torch.tensor([list(ids)]), use_cache=False).logits[0]
    return [int(i) for i in logits.argmax(-1)]


def probe(checkpoint: Path, n: int, overrides: Sequence[str]) -> tuple[int, int, int]:
    """(number tokens right, number tokens, demonstrations all right) over the first ``n`` held-out tasks."""
    cfg = load_config(checkpoint / RUN_CONFIG_FILE, list(overrides))
    codec = load_codec(cfg.model.tokenizer)
    factory = make_factory(cfg.env, cfg.seed)
    expert = functools.partial(expert_demo, p_tool=1.0, p_verbose=0.0)
    demos = asyncio.run(build_demos(codec, factory, expert, factory.tasks("test")[:n], cfg.seed))
    model = load_model(checkpoint).eval()

    @functools.cache
    def is_number(token: int) -> bool:
        return codec.decode([token]).strip().isdigit()

    right = total = whole = 0
    for demo in demos:
        r, t, ok = tally(argmax_next(model, demo.ids), demo, is_number)
        right, total, whole = right + r, total + t, whole + ok
    return right, total, whole


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--n", type=int, default=24, help="held-out tasks probed")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_intermixed_args()
    torch.set_num_threads(1)
    right, total, whole = probe(args.checkpoint, args.n, args.overrides)
    print(f"RESULT demos={args.n} number_tokens={total} numbers_right={right / max(1, total):.3f} all_right={whole}")


if __name__ == "__main__":
    main()
