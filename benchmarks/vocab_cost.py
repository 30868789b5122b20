"""What a vocabulary costs one SFT step: parameters, peak memory and time (run once per tokenizer: peak RSS is
per process).

    python benchmarks/vocab_cost.py harmonyrl_bpe
    python benchmarks/vocab_cost.py o200k_harmony [model.preset=micro sft.batch_size=16 ...]

Last line: ``RESULT tokenizer=… params=…M batch=BxT rss_before_step_mib=… peak_rss_mib=… step_s=…``.
"""

from __future__ import annotations

import asyncio
import resource
import sys
import time

import torch

from harmonyrl.config import load_config
from harmonyrl.harmony.codecs import load_codec
from harmonyrl.models.tiny_gpt_oss import num_parameters
from harmonyrl.run.setup import make_factory, make_model, setup_process
from harmonyrl.sft.train import build_demos, sft_batches, sft_step
from harmonyrl.tasks.factory import expert_for


def main() -> None:
    name, overrides = sys.argv[1], sys.argv[2:]
    cfg = load_config(None, [f"model.tokenizer={name}", "sft.steps=2", "threads=1", *overrides])
    setup_process(cfg.seed, cfg.threads)
    tok = load_codec(cfg.model.tokenizer)
    factory, model = make_factory(cfg), make_model(cfg, tok)
    expert = expert_for(cfg.env)
    tasks = factory.tasks("train")[: 2 * cfg.sft.batch_size]
    demos = asyncio.run(build_demos(tok, factory, expert, tasks, cfg.seed))  # the env's knobs are bound
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.sft.lr)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    seconds = 0.0
    batches = sft_batches(demos, cfg.sft, cfg.seed)
    for batch in batches:  # the second step is timed: the first pays one-off allocations
        start = time.perf_counter()
        sft_step(model, optimizer, batch, tok.special.endoftext)
        seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    width = max(len(d.ids) for d in batches[-1])
    print(
        f"RESULT tokenizer={name} params={num_parameters(model) / 1e6:.2f}M batch={cfg.sft.batch_size}x{width} "
        f"rss_before_step_mib={before / 1024:.0f} peak_rss_mib={peak / 1024:.0f} step_s={seconds:.1f}"
    )


if __name__ == "__main__":
    main()
