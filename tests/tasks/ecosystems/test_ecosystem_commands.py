"""Every ecosystem adapter (reasoning_gym, verifiers, textarena, openenv) through the commands a user runs
(issue 40, item 5): ``check-env``; ``train``, whose resolved config records the package's version; ``eval``;
``show``; ``report``; ``replay`` (bit-exact weights, and ``--rescore`` through the env rebuilt from the record).
Slow: ``compare``, ``sweep``, ``train --resume`` after a SIGKILL mid-RL (equal to the uninterrupted run), Ray env
workers (``scale.ray=true``; refused for openenv, in one line) and the async pipeline (``rl.async.max_staleness=1``),
each a real process.

Each run is a nano model on the adapter's smallest real environment (the packages pinned in the ``test`` extra and
the two example packages). The textarena and openenv runs start from a fresh model (``sft.steps=0``: neither ships
an expert), so their episodes are malformed turns scored 0; the commands' plumbing is what is under test, and
``rl.skip_zero_variance_groups=false`` with an entropy bonus makes every step move the weights all the same, so
"bit-identical" and "equal after resume" are not trivially true. The matrix is in each ecosystem's doc page under
"Commands"."""

from __future__ import annotations

import csv
import importlib.metadata
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from harmonyrl.cli import app
from harmonyrl.jobs.replay import replay_step
from kill_resume import killed_and_resumed, same_episodes
from tiny_run import tiny_run

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
PATHS = [str(EXAMPLES / "verifiers_envs"), str(EXAMPLES / "openenv_envs")]
VOLATILE = ("time/", "rollout/tokens_per_s", "engine/")  # wall clock and batching: depend on the machine
MOVING = ("threads=1", "rl.skip_zero_variance_groups=false", "rl.entropy_coef=0.01")
SMALL_EVAL = ("eval.n_tasks=2", "eval.samples_per_task=1")


@dataclass(frozen=True)
class Adapter:
    overrides: tuple[str, ...]
    """The ``env.*`` (and warm-start) settings of a tiny run on it."""
    check: tuple[str, ...]
    """``harmonyrl check-env`` target and kwargs."""
    distribution: str
    """The package whose version the resolved config records (``env.package_version``)."""
    prompt: str
    """Text ``show`` prints for the first training task."""
    sized: bool = True
    """Takes ``env.n_train`` / ``env.n_test`` (verifiers reads its taskset's own size)."""


ADAPTERS = {
    "reasoning_gym": Adapter(
        (
            "env.name=reasoning_gym",
            "env.tasks=[letter_counting]",
            "env.config.letter_counting.min_words=1",
            "env.config.letter_counting.max_words=2",
        ),
        ("harmonyrl.tasks.ecosystems.reasoning_gym:custom_factory", "tasks=letter_counting"),
        "reasoning-gym",
        "How many times does the letter",
    ),
    "verifiers": Adapter(
        (
            "env.name=verifiers",
            "env.id=vf_sum",
            "env.kwargs.num_tasks=100",
            f"sft.expert={EXAMPLES / 'verifiers_envs' / 'experts.py'}:sum_expert",
        ),
        ("harmonyrl.tasks.ecosystems.verifiers:custom_factory", "id=vf_sum", "num_tasks=30"),
        "verifiers",
        "What is ",
        sized=False,
    ),
    "textarena": Adapter(
        ("env.name=textarena", "env.game=GuessTheNumber-v0", "sft.steps=0"),
        ("harmonyrl.tasks.ecosystems.textarena:TextArenaFactory", "game=GuessTheNumber-v0"),
        "textarena",
        "GuessTheNumber-v0 seed",
    ),
    "openenv": Adapter(
        ("env.name=openenv", "env.client=guess_env:GuessEnv", "env.app=guess_env.server.app:app", "sft.steps=0"),
        (
            "harmonyrl.tasks.ecosystems.openenv:OpenEnvFactory",
            "client=guess_env:GuessEnv",
            "app=guess_env.server.app:app",
        ),
        "openenv-core",
        "GuessEnv seed",
    ),
}
NAMES = list(ADAPTERS)

runner = CliRunner()


def config(name: str, *changes: str) -> list[str]:
    """The tiny run's overrides on adapter ``name``, then ``changes``."""
    adapter = ADAPTERS[name]
    merged = tiny_run(*MOVING, *SMALL_EVAL, *adapter.overrides, *changes)
    if adapter.sized:
        return merged
    return [o for o in merged if not o.startswith(("env.n_train=", "env.n_test="))]


def ok(args: list[str]) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 0, (args, result.output)
    return " ".join(result.output.split())


def rows(run: Path) -> list[dict[str, object]]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(VOLATILE)} for line in lines]


def rl_rows(run: Path) -> list[dict[str, object]]:
    return [r for r in rows(run) if r["phase"] == "rl"]


# ---- in this process: each adapter's one tiny run, then the commands that read it ----------------------------


@pytest.fixture(scope="module", autouse=True)
def examples_importable() -> Iterator[None]:
    sys.path[:0] = PATHS
    yield
    for path in PATHS:
        sys.path.remove(path)


@pytest.fixture(scope="module", params=NAMES)
def trained(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """Adapter name and its tiny run's folder (``harmonyrl train``, in this process)."""
    name: str = request.param
    out = tmp_path_factory.mktemp(name)
    said = ok(["train", *config(name), f"output_dir={out}", "run_name=run"])
    assert "held-out pass@1:" in said
    return name, out / "run"


@pytest.mark.parametrize("name", NAMES)
def test_check_env_passes(name: str) -> None:
    said = ok(["check-env", *ADAPTERS[name].check, "--tasks", "2"])
    assert "environment contract OK" in said


def test_train_runs_rl_and_records_the_package_version(trained: tuple[str, Path]) -> None:
    name, run = trained
    assert [r["step"] for r in rl_rows(run)] == [1, 2]
    assert all(r["train/skipped"] == 0.0 for r in rl_rows(run))  # every step trained: the weights moved
    recorded = yaml.safe_load((run / "config.yaml").read_text())["env"]["package_version"]
    assert recorded == importlib.metadata.version(ADAPTERS[name].distribution)


def test_eval_reads_the_env_from_the_checkpoint(trained: tuple[str, Path]) -> None:
    name, run = trained
    said = ok(["eval", "--checkpoint", str(run / "checkpoints" / "final"), *SMALL_EVAL])  # no env.*: the record's
    assert f"evaluating env '{name}', the env" in said
    assert '"eval/episodes": 2.0' in said and '"eval/pass@1":' in said


def test_show_prints_the_steps_episodes(trained: tuple[str, Path]) -> None:
    name, run = trained
    said = ok(["show", str(run), "--step", "1", "--limit", "2"])
    assert "step 1: 2 of 4 episodes" in said and ADAPTERS[name].prompt in said and "reward" in said


def test_the_report_renders_the_run(trained: tuple[str, Path]) -> None:
    name, run = trained
    ok(["report", str(run), "--episodes", "2"])
    page = (run / "report" / "index.html").read_text()
    assert ADAPTERS[name].prompt.strip() in page and "Reward and success" in page and "Sample episodes" in page


def test_replay_is_bit_exact_and_rescoring_through_the_env_agrees(trained: tuple[str, Path]) -> None:
    _, run = trained
    last = replay_step(run, 2)  # step 1 chained from its episodes, then step 2 against checkpoints/final
    assert (last.chained, last.identical, last.matches_metrics) == (1, True, True)
    said = ok(["replay", str(run), "--step", "1", "--rescore"])
    assert "re-scored 4 episodes: 0 rewards differ" in said


@pytest.mark.parametrize("name", ["textarena", "openenv"])
def test_a_warm_start_of_0_steps_needs_no_expert(name: str, tmp_path: Path) -> None:
    """What ``compare`` runs first, from a fresh model on an env that ships no expert (it asked for one before)."""
    ok(["sft", *config(name), f"output_dir={tmp_path}", "run_name=warm"])
    assert (tmp_path / "warm" / "checkpoints" / "sft" / "config.json").is_file()


# ---- slow: each a real `harmonyrl` process (the env reached by PYTHONPATH, as a user's shell would) -----------

ENV = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": os.pathsep.join([*PATHS, os.environ.get("PYTHONPATH", "")])}


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "harmonyrl.cli", *args]


def process(*args: str) -> str:
    done = subprocess.run(cli(*args), env=ENV, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_a_killed_and_resumed_run_equals_the_uninterrupted_one(name: str, tmp_path: Path) -> None:
    four = config(name, "rl.steps=4")
    process("train", *four, f"output_dir={tmp_path}", "run_name=whole")
    run = tmp_path / "cut"
    killed_and_resumed([*four, f"output_dir={tmp_path}", "run_name=cut"], run, env=ENV)
    assert rows(run) == rows(tmp_path / "whole")
    assert same_episodes(run, tmp_path / "whole")


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_compare_runs_an_algorithm_on_it(name: str, tmp_path: Path) -> None:
    process("compare", "--algos", "grpo", "--out", str(tmp_path / "cmp"), *config(name))
    assert (tmp_path / "cmp" / "compare.md").is_file()
    summary = json.loads((tmp_path / "cmp" / "grpo-seed0" / "summary.json").read_text())
    assert summary  # the RL run finished and summarised itself
    assert len(rl_rows(tmp_path / "cmp" / "grpo-seed0")) == 2


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_a_two_trial_sweep_completes_both_trials(name: str, tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    process("sweep", "--trials", "2", "--no-prune", "--param", "rl.lr=log:1e-5:1e-3", "--out", str(out), *config(name))
    with (out / "trials.csv").open() as f:
        trials = list(csv.DictReader(f))
    assert len(trials) == 2 and all(t["state"] == "complete" for t in trials), trials
    best = yaml.safe_load((out / "best_config.yaml").read_text())
    assert best["env"]["name"] == name


def test_ray_env_workers_are_refused_for_openenv_in_one_line(tmp_path: Path) -> None:
    """An episode holds its server session across calls; a Ray worker running one call at a time hung on it."""
    result = runner.invoke(app, ["train", *config("openenv", "scale.ray=true"), f"output_dir={tmp_path}"])
    assert result.exit_code == 2 and result.output.strip().count("\n") == 0, result.output
    assert "env.name=openenv does not support scale.ray" in result.output
    assert not any(tmp_path.iterdir())  # refused before any work


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in NAMES if n != "openenv"])
def test_ray_env_workers_run_it(name: str, tmp_path: Path) -> None:
    process("train", *config(name, "scale.ray=true", "scale.env_workers=1"), f"output_dir={tmp_path}", "run_name=r")
    rl = rl_rows(tmp_path / "r")
    assert [r["step"] for r in rl] == [1, 2] and all(r["rollout/episodes"] == 4.0 for r in rl)
    assert all(r["env/workers_alive"] == 1.0 for r in rl)  # logged only when the envs live on Ray workers


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_the_async_pipeline_runs_it_and_replays_bit_exactly(name: str, tmp_path: Path) -> None:
    changes = ("rl.async.max_staleness=1", "rl.correction.weights.mode=truncate")
    process("train", *config(name, *changes), f"output_dir={tmp_path}", "run_name=a")
    rl = rl_rows(tmp_path / "a")
    assert [r["step"] for r in rl] == [1, 2] and all(r["train/skipped"] == 0.0 for r in rl)
    assert rl[1]["async/staleness_max"] == 1.0  # step 2 trained on episodes sampled one version behind
    last = replay_step(tmp_path / "a", 2)
    assert (last.chained, last.identical, last.matches_metrics) == (1, True, True)
