"""The report's figures: which metrics go on which plot, drawn with matplotlib's Agg renderer into PNG bytes.

Figures are built as ``matplotlib.figure.Figure`` objects, never through ``pyplot``: pyplot keeps global
state and picks a GUI backend from the environment, while a bare ``Figure`` renders with Agg wherever it runs
(a training loop, a headless server) and is freed when it goes out of scope.

A panel whose metrics are all absent is skipped and named, never drawn empty: which metrics exist depends on
the run (a quick run whose groups all had zero variance never updates, so it has no ``train/`` keys).
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from harmonyrl.telemetry.series import Series

Style = Literal["line", "markers", "points"]


@dataclass(frozen=True)
class Line:
    key: str
    label: str
    style: Style = "line"


@dataclass(frozen=True)
class Plot:
    slug: str
    title: str
    caption: str
    png: bytes


@dataclass(frozen=True)
class LinePanel:
    slug: str
    title: str
    caption: str
    lines: tuple[Line, ...]
    xlabel: str = "RL step"
    unit_range: Literal["always", "auto", "never"] = "never"
    """"auto": pin the y axis to [0, 1] when every value lies there (flat zero curves then read as zero)."""


LINE_PANELS: tuple[LinePanel, ...] = (
    LinePanel(
        "reward",
        "Reward and success",
        "Training rollouts (lines) and held-out evaluation: sampled pass@1 (circles) and greedy success "
        "(squares). Step 0 is the policy before RL.",
        (
            Line("rollout/reward", "rollout reward"),
            Line("rollout/success", "rollout success"),
            Line("eval/success", "eval pass@1 (sampled)", "markers"),
            Line("eval_greedy/success", "eval greedy success", "points"),
        ),
        unit_range="auto",
    ),
    LinePanel(
        "kl",
        "KL divergence",
        "train/kl_ref_k3: policy vs the frozen reference. mismatch/kl_*: sampler vs trainer log-probs on the "
        "same tokens, which should stay near 0.",
        (
            Line("train/kl_ref_k3", "KL to reference (k3)"),
            Line("mismatch/kl_k1", "sampler‖trainer (k1)"),
            Line("mismatch/kl_k3", "sampler‖trainer (k3)"),
        ),
    ),
    LinePanel(
        "entropy", "Entropy", "Mean per-token policy entropy on sampled tokens.", (Line("train/entropy", "entropy"),)
    ),
    LinePanel(
        "grad_norm",
        "Gradient norm",
        "Largest pre-clip gradient norm of the step.",
        (Line("train/grad_norm", "grad norm"),),
    ),
    LinePanel(
        "clip_fraction",
        "Clip fraction",
        "Share of tokens whose PPO ratio was clipped.",
        (Line("train/clip_fraction", "clip fraction"),),
        unit_range="always",
    ),
    LinePanel(
        "response_length",
        "Response length",
        "Sampled tokens per episode (all turns).",
        (Line("rollout/response_tokens", "rollout"), Line("eval/response_tokens", "eval (sampled)", "markers")),
    ),
    LinePanel(
        "tool_calls",
        "Tool-call rate",
        "Share of episodes with at least one tool call.",
        (Line("rollout/tool_call_rate", "rollout"), Line("eval/tool_call_rate", "eval (sampled)", "markers")),
        unit_range="always",
    ),
    LinePanel(
        "parse_errors",
        "Parse errors",
        "Share of episodes with a turn the harmony parser rejected; truncation (length or turn limit) for scale.",
        (
            Line("rollout/parse_error_rate", "rollout parse errors"),
            Line("eval/parse_error_rate", "eval parse errors", "markers"),
            Line("rollout/truncated_rate", "rollout truncated"),
        ),
        unit_range="always",
    ),
    LinePanel("sft", "SFT loss", "Supervised warm start on demonstrations.", (Line("sft/loss", "loss"),), "SFT step"),
)


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def _draw(ax: Axes, steps: list[int], values: list[float], label: str, style: Style) -> None:
    marker = "." if len(steps) < 60 else None
    if style == "line":
        ax.plot(steps, values, label=label, lw=1.6, marker=marker)
    elif style == "markers":
        ax.plot(steps, values, label=label, lw=1.0, ls=":", marker="o", ms=6)
    else:
        ax.plot(steps, values, label=label, ls="none", marker="s", ms=7)


def line_plot(panel: LinePanel, series: Series) -> Plot | None:
    present = [line for line in panel.lines if line.key in series]
    if not present:
        return None
    fig = Figure(figsize=(8, 3.2), layout="constrained")
    ax = fig.add_subplot()
    for line in present:
        _draw(ax, *series[line.key], line.label, line.style)
    ax.set_xlabel(panel.xlabel)
    ax.grid(alpha=0.3)
    values = [v for line in present for v in series[line.key][1]]
    if panel.unit_range == "always" or (panel.unit_range == "auto" and all(0.0 <= v <= 1.0 for v in values)):
        ax.set_ylim(-0.03, 1.03)
    ax.legend(fontsize=8, loc="best")
    return Plot(panel.slug, panel.title, panel.caption, _png(fig))


def grid_plot(slug: str, title: str, caption: str, series: Series, keys: Sequence[str]) -> Plot | None:
    """Small multiples, one axis per key: these metrics have unrelated scales (ESS near 1, χ² near 0 …)."""
    if not keys:
        return None
    cols = min(3, len(keys))
    rows = -(-len(keys) // cols)
    fig = Figure(figsize=(10, 2.3 * rows), layout="constrained")
    for i, key in enumerate(keys):
        ax = fig.add_subplot(rows, cols, i + 1)
        _draw(ax, *series[key], key, "line")
        ax.set_title(key, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    return Plot(slug, title, caption, _png(fig))


def _aligned(series: Series, key: str, steps: list[int]) -> list[float]:
    """Values of ``key`` on ``steps``, 0 where it was not recorded (failure counts are only written when > 0)."""
    if key not in series:
        return [0.0] * len(steps)
    by_step = dict(zip(*series[key], strict=True))
    return [by_step.get(s, 0.0) for s in steps]


def failures_plot(series: Series) -> Plot | None:
    kinds = sorted(k for k in series if k.startswith("env/failure_"))
    if not kinds:
        return None
    steps = sorted({s for k in [*kinds, "rollout/failed"] if k in series for s in series[k][0]})
    fig = Figure(figsize=(8, 3.2), layout="constrained")
    ax = fig.add_subplot()
    bottom = [0.0] * len(steps)
    for kind in kinds:
        counts = _aligned(series, kind, steps)
        ax.bar(steps, counts, bottom=bottom, label=kind.removeprefix("env/failure_"), width=0.8)
        bottom = [b + c for b, c in zip(bottom, counts, strict=True)]
    ax.set_xlabel("RL step")
    ax.set_ylabel("episodes")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    caption = "Environment faults per step by class. These episodes are masked out of the loss, not scored 0."
    return Plot("failures", "Failures by class", caption, _png(fig))


def time_plot(series: Series) -> Plot | None:
    """Per-step wall time split into rollout, train and the rest; then run totals including the per-episode
    generation and tool seconds (summed over concurrent episodes, so they can exceed wall time)."""
    parts = [k for k in ("time/rollout_s", "time/train_s") if k in series]
    totals = {
        label: sum(series[key][1])
        for label, key in (
            ("rollout (wall)", "time/rollout_s"),
            ("train (wall)", "time/train_s"),
            ("generation (Σ episodes)", "time/episode_generation_s"),
            ("tools (Σ episodes)", "time/episode_tool_s"),
        )
        if key in series
    }
    if not parts and not totals:
        return None
    fig = Figure(figsize=(10, 3.4), layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=(3, 2))
    steps = sorted({s for k in [*parts, "time/step_s"] if k in series for s in series[k][0]})
    bottom = [0.0] * len(steps)
    for key in parts:
        secs = _aligned(series, key, steps)
        left.bar(steps, secs, bottom=bottom, label=key.removeprefix("time/").removesuffix("_s"), width=0.8)
        bottom = [b + s for b, s in zip(bottom, secs, strict=True)]
    if "time/step_s" in series:
        other = [max(t - b, 0.0) for t, b in zip(_aligned(series, "time/step_s", steps), bottom, strict=True)]
        left.bar(steps, other, bottom=bottom, label="other", width=0.8, color="0.75")
    left.set_xlabel("RL step")
    left.set_ylabel("seconds")
    left.grid(alpha=0.3, axis="y")
    left.legend(fontsize=8)
    right.barh(list(totals), list(totals.values()), color=[f"C{i}" for i in range(len(totals))])
    right.invert_yaxis()
    right.set_xlabel("seconds, whole run")
    right.tick_params(labelsize=8)
    right.grid(alpha=0.3, axis="x")
    caption = (
        "Left: wall time per RL step. Right: run totals; generation and tool seconds are summed over episodes "
        "that run concurrently, so they can exceed the rollout wall time."
    )
    return Plot("time", "Where the time went", caption, _png(fig))


ORDER = (
    "reward",
    "kl",
    "entropy",
    "grad_norm",
    "clip_fraction",
    "mismatch",
    "importance_weights",
    "response_length",
    "tool_calls",
    "parse_errors",
    "failures",
    "sft",
    "time",
)
"""Reading order: outcomes first, then the health of the update, then behaviour, then cost."""


def build_plots(series: Series) -> tuple[list[Plot], list[str]]:
    """Every plot the metrics allow, in :data:`ORDER`, and the titles of those skipped for lack of data."""
    mismatch = sorted(k for k in series if k.startswith("mismatch/") and k not in ("mismatch/kl_k1", "mismatch/kl_k3"))
    mismatch += [k for k in ("train/ratio_max_dev_first_mb",) if k in series]
    weights = sorted(k for k in series if k.startswith("is/"))
    grid_caption = "One panel per metric: they have unrelated scales."
    pass_k = sorted((k for k in series if re.fullmatch(r"eval/pass@\d+", k)), key=lambda k: int(k.split("@")[1]))
    extra = tuple(Line(k, f"eval {k.removeprefix('eval/')}", "markers") for k in pass_k if k != "eval/pass@1")
    # pass@k for k > 1, when an evaluation records it, belongs beside pass@1
    panels = [replace(p, lines=p.lines + extra) if p.slug == "reward" else p for p in LINE_PANELS]
    built: dict[str, tuple[str, Plot | None]] = {p.slug: (p.title, line_plot(p, series)) for p in panels}
    built["mismatch"] = (
        "Train/inference mismatch",
        grid_plot("mismatch", "Train/inference mismatch", grid_caption, series, mismatch),
    )
    built["importance_weights"] = (
        "Importance weights",
        grid_plot("importance_weights", "Importance weights", grid_caption, series, weights),
    )
    built["failures"] = ("Failures by class", failures_plot(series))
    built["time"] = ("Where the time went", time_plot(series))
    plots = [plot for slug in ORDER if (plot := built[slug][1]) is not None]
    skipped = [title for slug in ORDER if built[slug][1] is None for title in [built[slug][0]]]
    return plots, skipped
