"""``harmonyrl plan``: a run's memory per device, layout, throughput, time and cost, printed before it runs; and
the plan check every ``train`` ends with (the prediction beside what the run measured, into ``summary.json``).

The command itself (its options) is declared in :mod:`harmonyrl.cli`, which loads the run config; this module
turns that config into a :class:`~harmonyrl.plan.estimate.RunPlan` and prints it as tables or JSON.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from harmonyrl.cli.common import console, fail
from harmonyrl.config import RunConfig
from harmonyrl.errors import CheckpointError
from harmonyrl.plan.check import add_to_summary, check_run
from harmonyrl.plan.estimate import RunPlan, plan_run
from harmonyrl.plan.hardware import Hardware, UnknownHardware, calibrate, lookup
from harmonyrl.plan.model_size import model_config


def print_plan(
    run: RunConfig,
    model: str | None,
    hardware: str,
    measure: bool,
    price: str | None,
    tool_latency_s: float,
    gen_tokens: int | None,
    as_json: bool,
) -> None:
    """Plan ``run`` (with ``model`` if given) on ``hardware`` (or this machine, measured) and print it."""
    try:
        cost = None if price is None else float(price)
    except ValueError:
        raise fail(f"--price must be a number (a device-hour's price), got {price!r}") from None
    if cost is not None and not 0 <= cost < float("inf"):
        raise fail(f"--price must be a finite number >= 0, got {price!r}")
    try:
        device: Hardware = calibrate() if measure else lookup(hardware)
        config, label = model_config(run, model)
    except (UnknownHardware, CheckpointError) as e:
        raise fail(str(e)) from None
    positions = int(config.max_position_embeddings)
    if run.rollout.max_seq_len > positions:
        raise fail(f"rollout.max_seq_len={run.rollout.max_seq_len} exceeds {label}'s {positions} positions")
    plan = plan_run(run, config, label, device, price=cost, tool_latency_s=tool_latency_s, gen_tokens=gen_tokens)
    if as_json:
        console.print_json(json.dumps(as_dict(plan)))
        return
    _print_tables(plan)


def as_dict(plan: RunPlan) -> dict[str, Any]:
    """The plan as plain data (bytes as GiB)."""
    memory = {name: round(gib, 3) for name, gib in plan.memory.rows()}
    return {
        "model": plan.model,
        "hardware": dataclasses.asdict(plan.hardware),
        "parameters": plan.parameters,
        "active_parameters": plan.active_parameters,
        "memory_gib_per_train_device": memory,
        "rollout_gib_per_device": round(plan.rollout_memory_gib, 3),
        "fits": plan.fits,
        "layout": dataclasses.asdict(plan.layout),
        "tokens_per_s": {
            "decode": plan.decode_tokens_s,
            "prefill": plan.prefill_tokens_s,
            "train": plan.train_tokens_s,
        },
        "step_s": {**dataclasses.asdict(plan.step), "total": plan.step.total_s},
        "steps": plan.steps,
        "hours": plan.hours,
        "device_hours": plan.device_hours,
        "cost": plan.cost,
        "notes": list(plan.notes),
    }


def _count(n: int) -> str:
    """``n`` at its scale: 20.91 B, 1.31 M, 950 K."""
    for size, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return str(n)


def _print_tables(plan: RunPlan) -> None:
    hw = plan.hardware
    console.print(
        f"[bold]{plan.model}[/] on [bold]{hw.name}[/] ({hw.memory_gib:g} GiB, {hw.bf16_tflops:g} bf16 TFLOP/s, "
        f"{hw.bandwidth_gbs:g} GB/s): {_count(plan.parameters)} parameters, {_count(plan.active_parameters)} active "
        "a token",
        soft_wrap=True,
    )
    memory = Table(title="memory per training device (GiB)", title_justify="left")
    memory.add_column("component")
    memory.add_column("GiB", justify="right")
    for name, gib in plan.memory.rows():
        memory.add_row(name, f"{gib:.2f}")
    console.print(memory)
    lay = plan.layout
    where = "colocated engine" if lay.rollout_devices == 0 else (
        f"rollouts on {lay.rollout_devices} more device(s), tensor parallel {lay.tensor_parallel}, "
        f"{plan.rollout_memory_gib:.1f} GiB each"
    )  # fmt: skip
    verdict = "[green]fits[/]" if plan.fits else "[red]does not fit even at the largest layout[/]"
    console.print(f"layout: {lay.train_devices} training device(s) (FSDP), {where}: {verdict}", soft_wrap=True)
    rates = Table(title="throughput bounds and one step", title_justify="left")
    rates.add_column("what")
    rates.add_column("value", justify="right")
    for label, value in (
        ("decode tokens/s", f"{plan.decode_tokens_s:,.0f}"),
        ("prefill tokens/s", f"{plan.prefill_tokens_s:,.0f}"),
        ("training tokens/s", f"{plan.train_tokens_s:,.0f}"),
        ("rollout s / step", f"{plan.step.rollout_s:.2f}"),
        ("update s / step", f"{plan.step.update_s:.2f}"),
        ("weight sync s / step", f"{plan.step.sync_s:.2f}"),
        (f"step s ({'async: overlapped' if plan.step.overlapped else 'synchronous'})", f"{plan.step.total_s:.2f}"),
    ):
        rates.add_row(label, value)
    console.print(rates)
    for note in plan.notes:
        console.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)
    cost = "" if plan.cost is None else f", cost {plan.cost:,.2f} at {plan.price:g} a device-hour"
    console.print(
        f"{plan.steps} RL steps: {plan.hours:.2f} h on {lay.devices} device(s) = {plan.device_hours:.2f} "
        f"device-hours{cost}",
        soft_wrap=True,
    )


def resident_bytes(field: str, reset_peak: bool = False) -> int | None:
    """This process's resident memory now (``VmRSS``) or at its peak (``VmHWM``), None where unreadable.
    ``reset_peak``: start the peak over from now (``/proc/self/clear_refs``), so that a process that ran other work
    before (a test session) measures this run's peak, not its own."""
    try:
        if reset_peak:
            Path("/proc/self/clear_refs").write_text("5")
        lines = Path("/proc/self/status").read_text().splitlines()
        return next(int(line.split()[1]) * 1024 for line in lines if line.startswith(field + ":"))
    except (OSError, StopIteration, ValueError):
        return None


def check_plan(cfg: RunConfig, run_dir: Path, resident: int | None) -> None:
    """Record the plan's prediction beside the run's measurements in summary.json (harmonyrl.plan.check); a
    failure here is a warning: the run itself completed."""
    import torch

    cuda = torch.cuda.is_available() and cfg.device != "cpu"
    peak_now = resident_bytes("VmHWM")
    peak = torch.cuda.max_memory_allocated() if cuda else None
    if peak is None and peak_now is not None and resident is not None:
        peak = peak_now - resident
    try:
        entry = check_run(cfg, run_dir, peak, "cuda" if cuda else "cpu")
    except Exception as e:  # the check is auxiliary: say why, keep the run's result
        console.print(
            f"[yellow]warning:[/] the plan check failed: {escape(f'{type(e).__name__}: {e}')}", soft_wrap=True
        )
        return
    add_to_summary(run_dir, entry)
    p, m = entry["predicted"], entry["measured"]
    if m["step_s"] is not None:
        console.print(
            f"plan check: RL step predicted {p['step_s']:.2f} s (for the run's token counts) vs measured "
            f"{m['step_s']:.2f} s; "
            f"memory predicted {p['memory_gib']:.2f} GiB vs {m['memory_gib'] or 0:.2f} GiB measured "
            f"(summary.json, docs/plan.md)",
            soft_wrap=True,
            highlight=False,
        )
