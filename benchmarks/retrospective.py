"""The public GPT-OSS retrospective at small scale: a sink-less trainer kernel with sinks that carry real mass.

    python benchmarks/retrospective.py [--sink 4] [--seeds 3] [--sweep none,2,4,6] [--steps 20] [--out DIR]
                                       [key=value ...]

``benchmarks/mismatch.py`` shows the mismatch on a freshly initialised model, whose sinks take ~1/T of the
attention and barely matter. Here every warm start begins with its sink logits at ``model.sink_init`` and is
trained with the exact sink kernel, so its sinks carry the mass a GPT-OSS checkpoint's do. From the warm start
at ``--sink``, equal seeds and budget:
  (a) sink-aware engine, sink-less trainer (``harmonyrl_sinkless``), no correction — the retrospective's bug;
  (b) the same + sequence-level truncated IS;      (c) the same + token-level masked IS;
  (d) matched sink-aware kernels (the exact fused kernel in the trainer);
  (e) (d) with a bf16 engine, whose rounding flips MoE routing against the fp32 trainer, without and with
      routing replay (R3) — only with ``--routing`` (the bf16 engine decodes in torch, not the C step: slower).
``--seeds N`` runs every arm of the main experiment with seeds 0..N-1 from the one warm start (the seed varies the
RL sampling and the held-out samples, not the warm start); the report gives each arm's held-out pass@1 after RL as a
mean with its SE over the seeds and each arm's difference to (a) paired by seed (:mod:`harmonyrl.telemetry.stats`).
Then the sweep: (a) and (d) from a warm start at each ``--sweep`` sink init (seed 0 only).

Per-step curves are of the *training* reward (rollout/reward: held-out evaluation every step would cost more than
the step); held-out pass@1 is measured before and after RL. Writes ``retrospective.png`` (curves),
``sink_sweep.png`` and ``sweep.md`` (sweep), ``retrospective.md`` (arms, per-layer sink mass) into ``--out``.
Finished warm starts and runs already in ``--out`` are reused, so an interrupted benchmark continues where it stopped
and a longer ``--sweep`` adds only its new points.
Last line: ``RESULT seeds=N a_final=… a_final_se=… … d_final=… d_final_se=… [e_final=… e_r3_final=…]
b_vs_a_pp=… b_vs_a_se=… … d_vs_a_pp=… d_vs_a_se=… a_maxgrad=… d_maxgrad=… a_kl=… d_kl=… sink_mass=…`` (finals:
mean and SE over seeds; ``_vs_a``: paired differences in points; grad and KL: means over seeds of each run's max
grad norm and mean mismatch KL; the SE is ``nan`` with one seed).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import tempfile
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch
from rich.console import Console

from harmonyrl.algorithms.kl import kl_k3
from harmonyrl.config import load_config
from harmonyrl.jobs.train import sft_only, train
from harmonyrl.models.attention import set_kernel
from harmonyrl.models.sinks import sink_mass_by_layer
from harmonyrl.models.tiny_gpt_oss import load_model
from harmonyrl.rollout.store import read_step, step_path
from harmonyrl.telemetry.stats import Estimate, over_seeds, paired

SINKLESS, EXACT = "model.attention=harmonyrl_sinkless", "model.attention=harmonyrl_sink_sdpa"
ARMS: dict[str, tuple[str, list[str]]] = {
    "a": ("sink-less trainer, no correction", [SINKLESS]),
    "b": ("sink-less + seq-level TIS", [SINKLESS, "rl.correction.weights.mode=truncate",
                                        "rl.correction.weights.level=sequence"]),
    "c": ("sink-less + token-level MIS", [SINKLESS, "rl.correction.weights.mode=mask",
                                          "rl.correction.weights.level=token"]),
    "d": ("matched sink kernels", [EXACT]),
}  # fmt: skip
ROUTING_ARMS: dict[str, tuple[str, list[str]]] = {
    "e": ("(d) + bf16 engine (routing flips)", [EXACT, "rollout.engine.dtype=bfloat16"]),
    "e_r3": ("(e) + routing replay R3", [EXACT, "rollout.engine.dtype=bfloat16", "rl.routing_replay=r3"]),
}
PANELS = (
    ("rollout/reward", "training reward", False),
    ("mismatch/kl_k3", "mismatch KL (k3)", True),
    ("train/grad_norm", "grad norm (pre-clip, max)", True),
    ("mismatch/ess_seq", "sequence ESS", False),
    ("train/ratio_max_dev_first_mb", "|ratio − 1| on the first minibatch", False),
)
MEASURED_EPISODES = 32


def _rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _sink_arg(sink: str) -> list[str]:
    return [] if sink == "none" else [f"model.sink_init={sink}"]


def warm_start(sink: str, base: list[str], console: Console) -> Path:
    """SFT with the exact sink kernel from a model whose sinks start at ``sink``: the checkpoint folder."""
    done = Path(next(a.split("=", 1)[1] for a in base if a.startswith("output_dir="))) / f"sft_{sink}"
    if (done / "checkpoints" / "sft" / "config.json").is_file():  # an earlier invocation with the same --out
        console.print(f"warm start, sink_init={sink}: reusing {done}")
        return done / "checkpoints" / "sft"
    console.rule(f"warm start, sink_init={sink}")
    cfg = load_config(None, [*base, EXACT, *_sink_arg(sink), f"run_name=sft_{sink}"])
    return asyncio.run(sft_only(cfg, console))


def run_arm(name: str, extra: list[str], warm: Path, base: list[str], console: Console, seed: int = 0) -> Path:
    """One RL run from ``warm`` with ``seed``: its run folder (a finished one of an earlier invocation is reused).
    Seed 0's folder is ``name``, as before seeds existed; another seed's ``name_seedN``."""
    name = name if seed == 0 else f"{name}_seed{seed}"
    done = Path(next(a.split("=", 1)[1] for a in base if a.startswith("output_dir="))) / name
    if (done / "summary.json").is_file():
        console.print(f"({name}): reusing the finished run {done}")
        return done
    settings = [*base, *extra, f"model.init_from={warm}", "sft.steps=0", f"run_name={name}", f"seed={seed}"]
    cfg = load_config(None, settings)
    return asyncio.run(train(cfg, console)).run_dir


def sink_mass(warm: Path, run_dir: Path) -> torch.Tensor:
    """Sink share ``[L, H]`` of the warm start on the first RL step's episodes (what the policy really sees:
    multi-turn conversations with tool results), at most ``MEASURED_EPISODES`` of them."""
    ids, mask, _ = _episodes(run_dir)
    return sink_mass_by_layer(load_model(warm), ids, mask)


def _episodes(run_dir: Path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The first RL step's episodes (at most ``MEASURED_EPISODES``), right-padded: ids, attention and loss masks."""
    trajs = read_step(step_path(run_dir, 1))[:MEASURED_EPISODES]
    width = max(len(t.token_ids) for t in trajs)
    ids, mask, loss = (torch.zeros(len(trajs), width, dtype=torch.long) for _ in range(3))
    for i, t in enumerate(trajs):  # right padding: causal attention keeps the real tokens' rows exact
        ids[i, : len(t.token_ids)] = torch.tensor(t.token_ids)
        mask[i, : len(t.token_ids)] = 1
        loss[i, : len(t.token_ids)] = torch.tensor(t.loss_mask)
    return ids, mask, loss


@torch.no_grad()
def kl_by_position(warm: Path, run_dir: Path, buckets: tuple[int, ...] = (144, 176, 208)) -> list[float]:
    """Mean k3 KL(sink-aware ‖ sink-less) of the warm start on the sampled tokens of ``run_dir``'s first step,
    by position bucket (``< 144``, ``< 176``, ``< 208``, the rest; prompts take the first ~130 positions): where in
    an episode a sink-less kernel goes wrong."""
    ids, mask, loss = _episodes(run_dir)
    model = load_model(warm).eval()
    logps = []
    for kernel in ("harmonyrl_sink_sdpa", "harmonyrl_sinkless"):
        set_kernel(model, kernel)
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].double()
        logps.append(torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0])
    kl = kl_k3(logps[0], logps[1])
    sampled = loss[:, 1:].bool()
    pos = torch.arange(1, ids.shape[1]).expand_as(sampled)
    edges = (0, *buckets, ids.shape[1] + 1)
    out = []
    for lo, hi in itertools.pairwise(edges):
        sel = sampled & (pos >= lo) & (pos < hi)
        out.append(float(kl[sel].mean()) if bool(sel.any()) else float("nan"))
    return out


def summarize(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Held-out before/after, mean mismatch KL, max grad norm, mean ESS and the worst ratio deviation of a run."""
    rl = [r for r in rows if r["phase"] == "rl" and "mismatch/kl_k3" in r]
    evals = [r for r in rows if r["phase"] == "eval"]
    n = max(1, len(rl))
    return {
        "before": evals[0]["eval/success"],
        "final": evals[-1]["eval/success"],
        "kl": sum(r["mismatch/kl_k3"] for r in rl) / n,
        "grad": max((r["train/grad_norm"] for r in rl), default=0.0),
        "ess": sum(r["mismatch/ess_seq"] for r in rl) / n,
        "dev": max((r["train/ratio_max_dev_first_mb"] for r in rl), default=0.0),
        "reward_last5": sum(r["rollout/reward"] for r in rl[-5:]) / max(1, len(rl[-5:])),
    }


def plot_curves(runs: dict[str, list[dict[str, Any]]], labels: dict[str, str], path: Path, title: str) -> None:
    fig, axes = plt.subplots(1, len(PANELS), figsize=(4 * len(PANELS), 3.6))
    for key, rows in runs.items():
        rl = [r for r in rows if r["phase"] == "rl" and "mismatch/kl_k3" in r]
        for ax, (metric, name, log) in zip(axes, PANELS, strict=True):
            ax.plot([r["step"] for r in rl], [max(r.get(metric, 0.0), 1e-14) if log else r.get(metric, 0.0)
                                              for r in rl], label=f"({key}) {labels[key]}")  # fmt: skip
            ax.set_title(name, fontsize=9)
            ax.set_xlabel("RL step")
            if log:
                ax.set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_sweep(sweep: list[dict[str, float]], path: Path) -> None:
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    xs = [s["mass"] for s in sweep]
    ax1.plot(xs, [max(s["a_kl"], 1e-14) for s in sweep], "o-", label="(a) sink-less trainer")
    ax1.plot(xs, [max(s["d_kl"], 1e-14) for s in sweep], "s-", label="(d) matched kernels")
    ax1.set_yscale("log")
    ax1.set_title("mean mismatch KL (k3)", fontsize=9)
    ax2.plot(xs, [s["a_final"] for s in sweep], "o-", label="(a) sink-less trainer")
    ax2.plot(xs, [s["d_final"] for s in sweep], "s-", label="(d) matched kernels")
    ax2.plot(xs, [s["before"] for s in sweep], "k:", label="warm start")
    ax2.set_title("held-out pass@1 after RL", fontsize=9)
    for ax in (ax1, ax2):
        ax.set_xlabel("mean sink attention mass (warm start)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def arm_table(summary: dict[str, dict[str, float]], labels: dict[str, str]) -> list[str]:
    lines = [
        "| run | held-out pass@1 before → after | training reward, last 5 steps | mean mismatch KL (k3) "
        "| max grad norm | mean seq ESS | max \\|ratio − 1\\| (first minibatch) |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, s in summary.items():
        lines.append(f"| ({key}) {labels[key]} | {s['before']:.1%} → {s['final']:.1%} | {s['reward_last5']:.3f} | "
                     f"{s['kl']:.2e} | {s['grad']:.2f} | {s['ess']:.3f} | {s['dev']:.1e} |")  # fmt: skip
    return lines


def mass_table(mass: torch.Tensor, layer_types: list[str]) -> list[str]:
    heads = mass.shape[1]
    lines = ["| layer | type | " + " | ".join(f"head {h}" for h in range(heads)) + " | mean |",
             "|---|---|" + "---|" * (heads + 1)]  # fmt: skip
    for i, row in enumerate(mass.tolist()):
        cells = " | ".join(f"{v:.3f}" for v in row)
        lines.append(f"| {i} | {layer_types[i]} | {cells} | {sum(row) / heads:.3f} |")
    return lines


def sweep_lines(sweep: list[dict[str, Any]]) -> list[str]:
    lines = ["", "## sink-strength sweep: (a) sink-less trainer vs (d) matched kernels", "",
             "| sink_init | mean sink mass | held-out before | (a) after | (d) after | (a) KL | (d) KL "
             "| (a) max grad | (d) max grad |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for s in sorted(sweep, key=lambda s: s["mass"]):
        lines.append(f"| {s['sink']} | {s['mass']:.3f} | {s['before']:.1%} | {s['a_final']:.1%} | "
                     f"{s['d_final']:.1%} | {s['a_kl']:.2e} | {s['d_kl']:.2e} | {s['a_grad']:.2f} | "
                     f"{s['d_grad']:.2f} |")  # fmt: skip
    return lines


def sweep_point(sink: str, mass: float, a: dict[str, float], d: dict[str, float]) -> dict[str, Any]:
    return {"sink": sink, "mass": mass, "before": a["before"], "a_final": a["final"], "d_final": d["final"],
            "a_kl": a["kl"], "d_kl": d["kl"], "a_grad": a["grad"], "d_grad": d["grad"]}  # fmt: skip


def pooled(finals: dict[str, list[float]]) -> dict[str, tuple[Estimate, Estimate]]:
    """Each arm's figure over the seeds ``finals[arm][seed]``: its mean and SE, and its difference to (a) paired by
    seed (zero for (a) itself)."""
    a = dict(enumerate(finals["a"]))
    return {key: (over_seeds(dict(enumerate(v))), paired(a, dict(enumerate(v)))) for key, v in finals.items()}


def seeds_table(finals: dict[str, list[float]], labels: dict[str, str]) -> list[str]:
    """Each arm's held-out pass@1 after RL per seed, mean ± SE over the seeds, and the paired difference to (a)."""
    lines = ["| run | after RL, per seed | mean ± SE | − (a), paired by seed (pp) |", "|---|---|---|---|"]
    for key, (est, gap) in pooled(finals).items():
        per_seed = ", ".join(f"{v:.1%}" for v in finals[key])
        vs_a = "—" if key == "a" else f"{100 * gap.mean:+.1f} ± {100 * gap.se:.1f}"
        lines.append(f"| ({key}) {labels[key]} | {per_seed} | {100 * est.mean:.1f} % ± {100 * est.se:.1f} | {vs_a} |")
    return lines


def experiment(
    args: argparse.Namespace, base: list[str], out: Path, console: Console
) -> tuple[dict[str, list[dict[str, float]]], float]:
    """The arms from one warm start at ``args.sink``, each with every seed: their summaries ``{arm: [per seed]}``,
    and the warm start's sink mass."""
    arms = {**ARMS, **(ROUTING_ARMS if args.routing else {})}
    labels = {k: v[0] for k, v in arms.items()}
    warm = warm_start(args.sink, base, console)
    runs: dict[str, list[dict[str, Any]]] = {}
    dirs: dict[str, Path] = {}
    summary: dict[str, list[dict[str, float]]] = {k: [] for k in arms}
    for seed in range(args.seeds):
        for key, (label, extra) in arms.items():
            console.rule(f"({key}) {label}, seed {seed}")
            run_dir = run_arm(f"{key}_{args.sink}", extra, warm, base, console, seed)
            rows = _rows(run_dir)
            summary[key].append(summarize(rows))
            if seed == 0:
                dirs[key], runs[key] = run_dir, rows
    mass = sink_mass(warm, dirs["d"])
    title = f"sink_init={args.sink} (mean sink mass {float(mass.mean()):.2f}), {args.steps} RL steps"
    plot_curves(runs, labels, out / "retrospective.png", f"{title}, seed 0")
    by_pos = ", ".join(f"{v:.3g}" for v in kl_by_position(warm, dirs["d"]))
    finals = {k: [s["final"] for s in v] for k, v in summary.items()}
    lines = [f"## arms: {title}, seed 0", "", *arm_table({k: v[0] for k, v in summary.items()}, labels), "",
             f"## held-out pass@1 after RL over {args.seeds} seed(s) (one warm start)", "",
             *seeds_table(finals, labels), "",
             "## sink attention mass of the warm start, per layer and head", "",
             *mass_table(mass, list(load_model(warm).config.layer_types or [])), "",
             f"KL(sink-aware ‖ sink-less) of the warm start by position (<144, <176, <208, rest): {by_pos}",
             ]  # fmt: skip
    (out / "retrospective.md").write_text("\n".join(lines) + "\n")
    console.print("\n".join(lines), highlight=False)
    return summary, float(mass.mean())


def result_line(summary: dict[str, list[dict[str, float]]], mass: float) -> str:
    """The RESULT line (module docstring) from every arm's per-seed summaries."""
    n = len(summary["a"])
    pools = pooled({key: [s["final"] for s in per_seed] for key, per_seed in summary.items()})
    parts = [f"RESULT seeds={n}"]
    parts += [f"{key}_final={est.mean:.3f} {key}_final_se={est.se:.3f}" for key, (est, _) in pools.items()]
    parts += [f"{key}_vs_a_pp={100 * gap.mean:.1f} {key}_vs_a_se={100 * gap.se:.1f}"
              for key, (_, gap) in pools.items() if key != "a"]  # fmt: skip

    def mean(key: str, figure: str) -> float:
        return sum(s[figure] for s in summary[key]) / n

    parts.append(f"a_maxgrad={mean('a', 'grad'):.2f} d_maxgrad={mean('d', 'grad'):.2f} a_kl={mean('a', 'kl'):.3e} "
                 f"d_kl={mean('d', 'kl'):.3e} sink_mass={mass:.3f}")  # fmt: skip
    return " ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sink", default="5", help="sink_init of the main experiment's warm start")
    parser.add_argument("--sweep", default="", help="further sink inits for the (a)/(d) sweep, e.g. none,2,8")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seeds", type=int, default=1, help="the main experiment's arms with seeds 0..N-1")
    parser.add_argument("--routing", action="store_true", help="also run (e): bf16 engine without and with R3")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")
    if any(o.split("=", 1)[0] == "seed" for o in args.overrides):
        parser.error("the seeds are 0..N-1 of --seeds N, not a seed= override")
    console = Console()
    out = args.out or Path(tempfile.mkdtemp(prefix="harmonyrl-retrospective-"))
    base = [f"output_dir={out}", f"rl.steps={args.steps}", *args.overrides]
    summary, mass = experiment(args, base, out, console)
    sweep = [sweep_point(args.sink, mass, summary["a"][0], summary["d"][0])]
    for sink in [s for s in args.sweep.split(",") if s and s != args.sink]:
        w = warm_start(sink, base, console)
        got = {k: run_arm(f"{k}_{sink}", ARMS[k][1], w, base, console) for k in ("a", "d")}
        m = float(sink_mass(w, got["d"]).mean())
        sweep.append(sweep_point(sink, m, summarize(_rows(got["a"])), summarize(_rows(got["d"]))))
        plot_sweep(sorted(sweep, key=lambda s: s["mass"]), out / "sink_sweep.png")  # after each point: partial
        (out / "sweep.md").write_text("\n".join(sweep_lines(sweep)) + "\n")
        print(f"sweep so far: {json.dumps(sweep)}", flush=True)
    console.print("\n".join(sweep_lines(sweep)), highlight=False)
    print(f"plots: {out / 'retrospective.png'} {out / 'sink_sweep.png'}  tables: {out / 'retrospective.md'}")
    print(result_line(summary, mass))


if __name__ == "__main__":
    main()
