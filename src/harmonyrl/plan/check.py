"""Every run checks its plan: the prediction for the run's own config beside what the run measured.

``harmonyrl train`` calls :func:`check_run` when a run ends and writes its result into ``summary.json`` under
``plan``: the plan on this machine, measured (:func:`harmonyrl.plan.hardware.calibrate`, about a second), for the
token counts the run had (``rollout/response_tokens`` and ``rollout/episode_tokens``, mean per episode), beside
the run's mean RL step, rollout and update seconds (``time/*`` in ``metrics.jsonl``) and its memory peak (on a
GPU ``torch.cuda.max_memory_allocated``; on the CPU the process's peak resident size above what it held before
the run, which also counts the allocator's cached memory and the engine's decode buffers), with the ratio of
each prediction to its measurement.

The throughput figures are bounds: on tiny CPU models the per-step Python overhead, not FLOPs or bandwidth,
sets the pace, so the measured step is many times the predicted one there (docs/plan.md gives the measured
factors).
"""

from __future__ import annotations

import functools
import json
import statistics
from pathlib import Path
from typing import Any

from harmonyrl.config import RunConfig
from harmonyrl.learn.footprint import GIB
from harmonyrl.plan.estimate import plan_run
from harmonyrl.plan.hardware import Hardware, calibrate
from harmonyrl.plan.model_size import model_config

TIMES = {"step_s": "time/step_s", "rollout_s": "time/rollout_s", "update_s": "time/train_s"}


def check_run(run: RunConfig, run_dir: Path, peak_bytes: float | None, device: str = "cpu") -> dict[str, Any]:
    """The ``plan`` entry of ``summary.json`` for the run in ``run_dir`` (module docstring)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rl = [r for r in rows if r.get("phase") == "rl"]
    config, label = model_config(run, None)
    gen, length = (_mean(rl, f"rollout/{k}_tokens") for k in ("response", "episode"))
    plan = plan_run(run, config, label, _this_machine(device), gen_tokens=gen, seq_tokens=length)
    predicted = {"step_s": plan.step.total_s, "rollout_s": plan.step.rollout_s, "update_s": plan.step.update_s,
                 "memory_gib": plan.memory.total / GIB}  # fmt: skip
    measured: dict[str, float | None] = {name: _mean(rl, key) for name, key in TIMES.items()}
    measured["memory_gib"] = None if peak_bytes is None else peak_bytes / GIB
    ratio = {k: (predicted[k] / v if v else None) for k, v in measured.items()}
    return {"hardware": plan.hardware.name, "predicted": predicted, "measured": measured,
            "predicted_over_measured": ratio}  # fmt: skip


@functools.cache
def _this_machine(device: str) -> Hardware:
    """The device measured once per process (a second): a process that trains many runs (a sweep, the tests)
    pays it once."""
    return calibrate(1.0, device)


def _mean(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [float(r[key]) for r in rows if key in r]
    return statistics.fmean(values) if values else None


def add_to_summary(run_dir: Path, entry: dict[str, Any]) -> None:
    """Put ``entry`` into ``run_dir/summary.json`` as ``plan`` (written whole again: a small file)."""
    path = run_dir / "summary.json"
    summary = json.loads(path.read_text()) if path.is_file() else {}
    summary["plan"] = entry
    path.write_text(json.dumps(summary, indent=2))
