"""Does a warm start copy numbers yet? A teacher-forced probe of a checkpoint, in seconds.

    python benchmarks/copy_probe.py CHECKPOINT [--n 24] [key=value ...]

The env's scripted expert demonstrates each of the first ``--n`` held-out tasks (always with its tools, never
verbose: ``p_tool=1``, ``p_verbose=0``), and the demonstration is fed to the model; at every position the model
writes, its argmax is compared with the demonstration. For a deterministic env a completion whose every token is
the argmax is exactly what greedy decoding writes: "all right" is greedy success without decoding. Number tokens
are the ones a model must copy (calculator: from the prompt into the tool call, from the tool result into the
answer; browse: from a page into the answer). They are counted twice over:

* ``first_right``: the first token of each number, which the model must *find* (the right number of several);
* ``later_right``: the tokens after it, which it must *copy* on from where the first one stood.

A model that finds numbers but cannot copy them on (browse's many-webs warm start, docs/envs.md) shows a high
first and a low later rate; one that has not learnt where numbers go shows both low.
Any env with a scripted expert works; the env, tokenizer and seed are the checkpoint's own (its
``harmonyrl_config.yaml``; ``key=value`` on top). Last line: ``RESULT demos=… number_tokens=… numbers_right=…
first_right=… later_right=… all_right=…``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from harmonyrl.config import load_config
from harmonyrl.harmony.codecs import load_codec
from harmonyrl.models.tiny_gpt_oss import load_model
from harmonyrl.run.checkpoint_files import RUN_CONFIG_FILE
from harmonyrl.sft.train import Demo, build_demos
from harmonyrl.tasks.factory import expert_for, make_factory


@dataclass(frozen=True)
class Tally:
    """Teacher-forced counts over the written tokens of one or more demonstrations."""

    first_right: int = 0
    firsts: int = 0
    """First tokens of numbers (a number: a run of consecutive written number tokens)."""
    later_right: int = 0
    laters: int = 0
    """Number tokens after a number's first."""
    all_right: int = 0
    """Demonstrations whose every written token is the argmax."""

    @property
    def right(self) -> int:
        return self.first_right + self.later_right

    @property
    def total(self) -> int:
        return self.firsts + self.laters

    def __add__(self, other: Tally) -> Tally:
        return Tally(
            self.first_right + other.first_right,
            self.firsts + other.firsts,
            self.later_right + other.later_right,
            self.laters + other.laters,
            self.all_right + other.all_right,
        )


def tally(predicted: Sequence[int], demo: Demo, is_number: Callable[[int], bool]) -> Tally:
    """The counts for one demonstration: ``predicted[t]`` is the model's argmax after ``demo.ids[: t + 1]``;
    written tokens are those with mask 1, and a written number token is a number's first unless the token before
    it is a written number token too."""
    first_right = firsts = later_right = laters = 0
    all_right = True
    for t in range(1, len(demo.ids)):
        if not demo.mask[t]:
            continue
        good = predicted[t - 1] == demo.ids[t]
        all_right &= good
        if not is_number(demo.ids[t]):
            continue
        if demo.mask[t - 1] and is_number(demo.ids[t - 1]):
            laters, later_right = laters + 1, later_right + good
        else:
            firsts, first_right = firsts + 1, first_right + good
    return Tally(first_right, firsts, later_right, laters, int(all_right))


@torch.no_grad()
def argmax_next(model: torch.nn.Module, ids: Sequence[int]) -> list[int]:
    """The model's argmax next token after each prefix of ``ids`` (one forward pass)."""
    logits = model(input_ids=torch.tensor([list(ids)]), use_cache=False).logits[0]
    return [int(i) for i in logits.argmax(-1)]


def probe(checkpoint: Path, n: int, overrides: Sequence[str]) -> Tally:
    """The counts over the first ``n`` held-out tasks of the checkpoint's env."""
    cfg = load_config(checkpoint / RUN_CONFIG_FILE, list(overrides))
    codec = load_codec(cfg.model.tokenizer)
    factory = make_factory(cfg.env, cfg.seed)
    expert = expert_for(cfg.env.model_copy(update={"p_tool": 1.0, "p_verbose": 0.0}))
    demos = asyncio.run(build_demos(codec, factory, expert, factory.tasks("test")[:n], cfg.seed))
    model = load_model(checkpoint).eval()

    @functools.cache
    def is_number(token: int) -> bool:
        return codec.decode([token]).strip().isdigit()

    return sum((tally(argmax_next(model, demo.ids), demo, is_number) for demo in demos), Tally())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--n", type=int, default=24, help="held-out tasks probed")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_intermixed_args()
    torch.set_num_threads(1)
    try:
        t = probe(args.checkpoint, args.n, args.overrides)
    except (ValueError, OSError) as e:  # no expert (custom, relay), no checkpoint, a bad override
        sys.exit(f"copy_probe: {(str(e).splitlines() or [type(e).__name__])[0]}")
    print(
        f"RESULT demos={args.n} number_tokens={t.total} numbers_right={t.right / max(1, t.total):.3f} "
        f"first_right={t.first_right / max(1, t.firsts):.3f} later_right={t.later_right / max(1, t.laters):.3f} "
        f"all_right={t.all_right}"
    )


if __name__ == "__main__":
    main()
