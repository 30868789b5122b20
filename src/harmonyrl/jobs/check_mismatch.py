"""The mismatch gate (``harmonyrl check-mismatch``): N RL steps of a run against its engine, failed when the mean
sampler-vs-trainer KL exceeds a bound.

Each RL step logs ``mismatch/kl_k3``: the mean over the step's sampled tokens of the k3 estimate of
KL(sampler ‖ trainer) (:mod:`harmonyrl.algorithms.mismatch`). The gate runs the configured run for ``steps`` RL
steps (its SFT warm start included, so the weights the engine holds are the ones a real run's engine would hold
after its syncs), averages that per-step figure over the steps, and compares the mean with a bound. k3 rather
than k1: it is non-negative per token, so a mean cannot hide a mismatch behind cancelling signs.

The bound depends on the precision the two sides compute in (:func:`gate_precision`): matched fp32 kernels
agree to rounding, a bf16 side does not. :data:`BOUNDS` holds the documented bounds; docs/mismatch-gate.md gives
the measured figures they were chosen from and the margins. A run whose engine and trainer disagree in a way
that matters (a kernel that drops the attention sinks, a wrong weight sync) sits orders of magnitude above them.

The run is the user's run, with three changes that do not touch the mismatch (each overridable): every group is
trained on (``rl.skip_zero_variance_groups=false``: a group with equal rewards is still sampled by the engine
and scored by the trainer, and a skipped step would measure nothing), and the held-out evaluations before and
after RL are one task, one sample (they measure success, which the gate does not read).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rich.console import Console

from harmonyrl.config import RunConfig
from harmonyrl.engine.config import LocalEngineConfig, VllmEngineConfig
from harmonyrl.telemetry.metrics import read_metrics

Precision = Literal["fp32", "bf16"]

BOUNDS: dict[Precision, float] = {"fp32": 1e-6, "bf16": 1e-3}
"""The default bound on the mean per-token mismatch KL (k3) for each precision (docs/mismatch-gate.md: measured
figures, the margin, and why)."""

GATE_DEFAULTS: tuple[str, ...] = ("rl.skip_zero_variance_groups=false", "eval.n_tasks=1", "eval.samples_per_task=1")
"""Overrides the gate applies before the user's own (which win): see the module docstring."""

KL_KEY = "mismatch/kl_k3"


class GateInputError(ValueError):
    """A gate setting that is not usable (a bound that is not a positive number): one line."""


def parse_bound(text: str | None) -> float | None:
    """``--max-kl`` as given: ``None`` (the precision's default bound) or a finite number > 0."""
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise GateInputError(f"--max-kl must be a positive number (a KL per token, e.g. 1e-6), got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise GateInputError(f"--max-kl must be a finite number > 0 (a KL per token, e.g. 1e-6), got {text!r}")
    return value


def gate_precision(cfg: RunConfig) -> Precision:
    """bf16 when either side computes in bf16: the trainer (``model.precision``), the embedded engine
    (``rollout.engine.dtype``), or a vLLM server sent bf16 weights at each sync (``rollout.engine.sync_dtype``);
    else fp32."""
    engine = cfg.rollout.engine
    if cfg.model.precision == "bf16":
        return "bf16"
    if isinstance(engine, LocalEngineConfig) and engine.dtype == "bfloat16":
        return "bf16"
    if isinstance(engine, VllmEngineConfig) and engine.weight_sync == "reload" and engine.sync_dtype == "bfloat16":
        return "bf16"
    return "fp32"


def engine_label(cfg: RunConfig) -> str:
    """The engine the gate measures, in words."""
    engine = cfg.rollout.engine
    if isinstance(engine, VllmEngineConfig):
        return f"vLLM at {engine.url}"
    return "embedded engine" + ("" if cfg.model.engine_sinks else " without sinks")


@dataclass(frozen=True)
class GateResult:
    """What the gate measured and decided."""

    kls: tuple[tuple[int, float], ...]
    """``(rl step, mean per-token k3 KL of that step)`` for every step that measured it."""
    bound: float
    precision: Precision
    engine: str
    run_dir: Path

    @property
    def mean(self) -> float:
        """Mean over the steps of the per-step KL (NaN when no step measured it)."""
        return statistics.fmean(v for _, v in self.kls) if self.kls else math.nan

    @property
    def worst(self) -> tuple[int, float]:
        """``(step, KL)`` of the step with the largest KL."""
        return max(self.kls, key=lambda sv: sv[1])

    @property
    def passed(self) -> bool:
        """Every measured KL finite and their mean within the bound; no measurement fails."""
        return bool(self.kls) and all(math.isfinite(v) for _, v in self.kls) and self.mean <= self.bound

    def line(self) -> str:
        """The verdict in one line."""
        where = f"{self.engine}, {self.precision}"
        if not self.kls:
            return f"mismatch gate failed: no RL step measured {KL_KEY} ({where}; run folder {self.run_dir})"
        step, worst = self.worst
        figures = (
            f"mean KL(sampler ‖ trainer) {self.mean:.3g} per token over {len(self.kls)} RL steps "
            f"(worst step {step}: {worst:.3g})"
        )
        if self.passed:
            return f"mismatch gate passed: {figures} <= bound {self.bound:g} ({where})"
        return f"mismatch gate failed: {figures} > bound {self.bound:g} ({where}; run folder {self.run_dir})"


def step_kls(metrics_file: Path) -> tuple[tuple[int, float], ...]:
    """``(step, mismatch/kl_k3)`` of every RL row of a run's ``metrics.jsonl`` that has it (a non-finite value
    is written as a string; it is read back as a float, so a NaN fails the gate)."""
    rows = read_metrics(metrics_file)
    return tuple((int(str(r["step"])), float(str(r[KL_KEY]))) for r in rows if r.get("phase") == "rl" and KL_KEY in r)


async def run_gate(cfg: RunConfig, bound: float | None, console: Console) -> GateResult:
    """Run ``cfg`` (its ``rl.steps`` RL steps, in ``output_dir/run_name``) and judge its mismatch against
    ``bound`` (default: :data:`BOUNDS` of the run's precision)."""
    from harmonyrl.jobs.train import train  # torch and transformers behind it

    result = await train(cfg, console)
    precision = gate_precision(cfg)
    chosen = BOUNDS[precision] if bound is None else bound
    kls = step_kls(result.run_dir / "metrics.jsonl")
    return GateResult(kls, chosen, precision, engine_label(cfg), result.run_dir)
