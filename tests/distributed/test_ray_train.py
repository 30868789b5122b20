"""``harmonyrl train scale.ray=true`` as a user runs it: the same run as in one process, in what is deterministic;
a cluster address where nothing answers is a one-line error before any compute; and the default run never
imports Ray."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harmonyrl.config import ConfigError, load_config
from harmonyrl.distributed.ray_cluster import import_ray
from harmonyrl.errors import ClusterError
from tiny_run import tiny_run

TINY = tiny_run("rl.steps=3", "rollout.group_size=4", "eval.samples_per_task=2", "threads=1")
VOLATILE = ("time/", "rollout/tokens_per_s", "engine/")  # wall-clock and batching: depend on the machine
POOL_ONLY = ("env/worker_faults", "env/workers_alive")  # the pool's own counters, absent from a one-process run


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "harmonyrl.cli", *args]


def _stable_rows(run: Path) -> list[dict[str, object]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE + POOL_ONLY)} for r in rows]


def test_train_on_two_ray_env_workers_equals_the_one_process_run(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    for name, extra in (("here", []), ("ray", ["scale.ray=true", "scale.env_workers=2"])):
        done = subprocess.run(_cli("train", *TINY, f"output_dir={tmp_path}", f"run_name={name}", *extra), env=env,
                              capture_output=True, text=True, timeout=600)  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
    here, on_ray = tmp_path / "here", tmp_path / "ray"
    # sampled ids, rewards, failures and turns of every RL episode, in order (the answers graded in the workers)
    assert (on_ray / "rollouts" / "episodes.jsonl").read_text() == (here / "rollouts" / "episodes.jsonl").read_text()
    assert _stable_rows(on_ray) == _stable_rows(here)  # SFT losses, evals, rewards, losses, grad norms, ...
    rl = [json.loads(line) for line in (on_ray / "metrics.jsonl").read_text().splitlines() if '"rl"' in line]
    assert [(r["env/worker_faults"], r["env/workers_alive"]) for r in rl] == [(0.0, 2.0)] * 3
    # (this tiny policy answers without the tool; tool calls through the workers: test_ray_envs.py)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_address_where_no_cluster_answers_is_a_one_line_error_before_any_compute(tmp_path: Path) -> None:
    address = f"127.0.0.1:{_closed_port()}"
    t0 = time.monotonic()
    done = subprocess.run(_cli("train", *TINY, f"output_dir={tmp_path}", "run_name=r", "scale.ray=true",
                               f"scale.address={address}"), capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout.strip() == f"error: scale.address={address}: no Ray cluster answers there (Connection refused)"
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "r").exists()  # nothing was started: no run folder
    assert time.monotonic() - t0 < 60  # the CLI's imports included; Ray's own connect would retry for minutes


def test_an_address_that_accepts_but_is_not_ray_is_a_one_line_error_within_the_timeout(tmp_path: Path) -> None:
    with socket.socket() as silent:  # listening, never answering: the kernel accepts, nobody speaks
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        t0 = time.monotonic()
        done = subprocess.run(_cli("train", *TINY, f"output_dir={tmp_path}", "run_name=r", "scale.ray=true",
                                   f"scale.address={address}", "scale.start_timeout_s=3"),
                              capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout.strip() == f"error: scale.address={address}: no Ray cluster answered there within 3 s"
    assert "Traceback" not in done.stderr and not (tmp_path / "r").exists()
    assert time.monotonic() - t0 < 60  # Ray alone retries for minutes


def test_bad_addresses_are_config_errors() -> None:
    for bad in ("nope", "host:x", ":6379", "host:99999", "ray://host"):
        with pytest.raises(ConfigError, match="is not HOST:PORT, ray://HOST:PORT or auto"):
            load_config(overrides=[f"scale.address={bad}"])
    assert load_config(overrides=["scale.address=ray://head:10001"]).scale.address == "ray://head:10001"


def test_without_ray_installed_scale_ray_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # what an uninstalled package looks like to ``import``
    with pytest.raises(ClusterError, match=r"pip install 'harmonyrl\[ray\]'"):
        import_ray()


def test_the_default_run_never_imports_ray() -> None:
    code = (
        "import sys, asyncio\n"
        "import harmonyrl.cli, harmonyrl.jobs.train\n"
        "from harmonyrl.config import load_config\n"
        "from harmonyrl.run.setup import make_factory\n"
        "make_factory(load_config(overrides=['env.n_train=8', 'env.n_test=2']))\n"
        "assert 'ray' not in sys.modules, 'ray was imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
