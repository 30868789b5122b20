"""Replaying a recorded RL step reproduces its update bit for bit; re-scoring gives the stored rewards back.

Named ``test_rollout_replay.py`` because ``tests/trainer/test_replay.py`` exists and the test folders are not
packages: two test modules with one basename stop pytest's collection of the whole suite.

The fixture run is built in-process the way ``train`` builds one (an SFT checkpoint, a learner on the
in-memory model, ``save_progress`` after every step, ``checkpoints/final`` at the end), with episodes of
real tasks whose turns the calculator env can score, but whose token streams are random: the update does
not care where tokens came from, and this keeps the test at a few seconds. The last two tests replay and
re-score a real ``harmonyrl train`` run (recorded by the loop) end to end.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harmonyrl.config import RunConfig, dump_config, load_config
from harmonyrl.errors import CheckpointError
from harmonyrl.harmony.tokenizer import HarmonyTokenizer
from harmonyrl.rollout.show import episodes_text
from harmonyrl.rollout.store import RolloutFileError, list_steps, read_step, step_path, write_step
from harmonyrl.tasks.arith import calculator
from harmonyrl.tasks.calculator import expression_of
from harmonyrl.telemetry.episodes import episode_to_json
from harmonyrl.trainer.checkpoint import save_checkpoint
from harmonyrl.trainer.learner import Learner
from harmonyrl.trainer.replay_step import ReplayError, differing_tensors, replay_step, replay_update, rescore
from harmonyrl.trainer.resume import save_progress
from harmonyrl.trainer.setup import load_for, make_factory, make_model, rl_start_model, setup_process
from harmonyrl.types import Failure, Message, Trajectory, Turn
from tiny_run import tiny_run

BASE = ["model.preset=nano", "rl.steps=2", "rl.lr=0.01", "env.n_train=16", "env.n_test=4", "threads=1"]
ALGORITHMS = {
    "grpo": [],
    "gae_kl": ["rl.advantage.kind=gae", "rl.kl.coef=0.05"],  # value head state + reference passes
    "soft_q": ["rl.loss.kind=soft_q", "rl.loss.replay_batch=6"],  # replay buffer with its own RNG
}


def _episode(config: RunConfig, task_index: int, group: int, correct: bool, seed: int) -> Trajectory:
    """A tool call, its result, a final answer (right or one off), over a random token stream."""
    task = make_factory(config).tasks("train")[task_index]
    expr = expression_of(task)
    call = Message("assistant", f'{{"expression": "{expr}"}}', "commentary", "functions.calculator", None, "json")
    result = Message("tool", calculator(expr), "commentary", "assistant", "functions.calculator")
    answer = task.answer if correct else str(int(task.answer) + 1)
    turns = (
        Turn((call,), None, (result,), 0.01, 0.002),
        Turn((Message("assistant", answer, "final"),), None, (), 0.01, 1e-5),
    )
    rng = random.Random(seed)
    n, prompt = rng.randint(30, 60), 20
    return Trajectory(
        task.id,
        group,
        tuple(rng.randrange(1, 1024) for _ in range(n)),
        (0,) * prompt + (1,) * (n - prompt),
        (0.0,) * prompt + tuple(-rng.expovariate(1.0) for _ in range(n - prompt)),
        float(correct),
        True,
        False,
        None,
        turns,
        reward_terms={"correct": float(correct), "format_error": 0.0, "tool_calls": 1.0},
    )


def _step_episodes(config: RunConfig, step: int) -> list[Trajectory]:
    eps = [_episode(config, 2 * step + g, g, correct=(i + g + step) % 2 == 0, seed=100 * step + 10 * g + i)
           for g in range(2) for i in range(3)]  # fmt: skip
    timed_out = dataclasses.replace(eps[0], failure=Failure("tool_timeout", "slow"), reward=0.0)
    return [*eps, timed_out]


@dataclasses.dataclass
class Run:
    path: Path
    after: list[dict[str, torch.Tensor]]
    """Weights after step 1 and step 2 of the original run."""
    metrics: list[dict[str, float]]
    after_step_1: Path
    """A copy of ``checkpoints/last`` as it was after step 1 (the run overwrote it after step 2)."""


@pytest.fixture(scope="module", params=list(ALGORITHMS))
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Run:
    root = tmp_path_factory.mktemp(request.param)
    config = load_config(None, [*BASE, *ALGORITHMS[request.param], f"output_dir={root}", "run_name=r"])
    path = root / "r"
    (path / "checkpoints").mkdir(parents=True)
    (path / "config.yaml").write_text(dump_config(config))
    setup_process(config.seed, config.threads)
    tok = HarmonyTokenizer.load_default()
    model = make_model(config, tok)
    save_checkpoint(path / "checkpoints" / "sft", model, None, 0, {})
    learner = Learner.create(config.rl, model, tok.special.endoftext, float(config.rollout.max_seq_len), config.seed)
    after, metrics = [], []
    for step in (1, 2):
        episodes = _step_episodes(config, step)
        write_step(step_path(path, step), step, episodes)
        update = learner.update(episodes)
        assert update.applied and not update.metrics["train/skipped"]
        metrics.append(update.metrics)
        after.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        save_progress(path, model, "rl", step, learner.optimizer, learner=learner.extra_state())
        if step == 1:
            shutil.copytree(path / "checkpoints" / "last", root / "after_step_1")
    save_checkpoint(path / "checkpoints" / "final", model, learner.optimizer, config.rl.steps, {})
    return Run(path, after, metrics, root / "after_step_1")


def _assert_bit_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    assert differing_tensors(a, b) == ()


def test_replay_update_on_stored_episodes_is_bit_exact(run: Run) -> None:
    """The plain path: a learner rebuilt at RL start + the stored episodes → the run's step-1 weights."""
    config = load_config(run.path / "config.yaml")
    setup_process(config.seed, config.threads)
    tok = HarmonyTokenizer.load_default()
    start = rl_start_model(config, run.path, tok)
    learner = Learner.create(config.rl, start, tok.special.endoftext, float(config.rollout.max_seq_len), config.seed)
    metrics = replay_update(learner, read_step(step_path(run.path, 1)))
    assert metrics == run.metrics[0]
    _assert_bit_equal(start.state_dict(), run.after[0])


def test_replay_step_chain_reproduces_every_step_and_the_final_checkpoint(run: Run, tmp_path: Path) -> None:
    first = replay_step(run.path, 1, save_to=tmp_path / "replayed_1")
    assert first.metrics == run.metrics[0]
    _assert_bit_equal(first.state_dict, run.after[0])
    assert first.identical is None and first.compared_with is None  # the run kept no checkpoint after step 1
    for pre in (run.after_step_1, tmp_path / "replayed_1"):  # the run's own copy, or the replay's
        second = replay_step(run.path, 2, checkpoint=pre)
        assert second.metrics == run.metrics[1]
        assert second.compared_with == run.path / "checkpoints" / "final"
        assert second.identical is True and second.differing == ()
        _assert_bit_equal(second.state_dict, run.after[1])


def test_replay_notices_a_different_update(run: Run, tmp_path: Path) -> None:
    copy = tmp_path / "r"
    shutil.copytree(run.path, copy)
    episodes = read_step(step_path(copy, 2))
    flipped = [dataclasses.replace(t, reward=1.0 - t.reward) for t in episodes]
    write_step(step_path(copy, 2), 2, flipped)
    result = replay_step(copy, 2, checkpoint=run.after_step_1)
    assert result.identical is False and len(result.differing) > 0


def test_replay_needs_the_checkpoint_before_the_step(run: Run) -> None:
    with pytest.raises(CheckpointError, match=r"needs the checkpoint saved after RL step 1.*--checkpoint"):
        replay_step(run.path, 2)  # checkpoints/last is at step 2
    with pytest.raises(CheckpointError, match=r"after RL step 1; '.*sft' was saved at step 0"):
        replay_step(run.path, 2, checkpoint=run.path / "checkpoints" / "sft")
    with pytest.raises(CheckpointError, match="do not pass a checkpoint"):
        replay_step(run.path, 1, checkpoint=run.after_step_1)
    with pytest.raises(ReplayError, match=r"between 1 and rl\.steps=2"):
        replay_step(run.path, 3)


def test_replay_of_a_missing_record_or_start_checkpoint_names_it(run: Run, tmp_path: Path) -> None:
    copy = tmp_path / "r"
    shutil.copytree(run.path, copy)
    step_path(copy, 1).unlink()
    with pytest.raises(RolloutFileError, match=r"step_00001\.parquet' does not exist"):
        replay_step(copy, 1)
    shutil.rmtree(copy / "checkpoints" / "sft")
    with pytest.raises(CheckpointError, match=r"sft' is missing: it holds the weights RL started from"):
        replay_step(copy, 2, checkpoint=run.after_step_1)


def test_rescore_gives_the_stored_rewards_back(run: Run) -> None:
    for step in (1, 2):
        rows = rescore(run.path, step)
        stored = read_step(step_path(run.path, step))
        assert len(rows) == len(stored) - 1  # the timed-out episode is skipped
        assert {r.stored_reward for r in rows} == {0.0, 1.0}
        assert all(r.new_reward == r.stored_reward for r in rows)


# ---------------------------------------------------------------- a real run of `harmonyrl train`

# A 3-step SFT model scores 0 everywhere and GRPO would skip every group: keep the groups and add an entropy
# bonus, so that each RL step really changes the weights (else "bit-exact" would be trivially true).
REAL = tiny_run("threads=1", "rl.skip_zero_variance_groups=false", "rl.entropy_coef=0.01")


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("real")
    cmd = [sys.executable, "-m", "harmonyrl.cli", "train", *REAL, f"output_dir={out}", "run_name=r"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return out / "r"


def _as_recorded(value: float) -> object:
    return value if math.isfinite(value) else str(value)  # metrics.jsonl writes non-finite floats as strings


def test_a_real_run_replays_bit_exactly(real_run: Path, tmp_path: Path) -> None:
    assert list_steps(real_run) == [1, 2]
    lines = (real_run / "rollouts" / "episodes.jsonl").read_text().splitlines()
    stored = [episode_to_json(t, s) for s in (1, 2) for t in read_step(step_path(real_run, s))]
    assert [json.loads(line) for line in lines] == json.loads(json.dumps(stored))  # same episodes, same order
    rl = {r["step"]: r for r in map(json.loads, (real_run / "metrics.jsonl").read_text().splitlines())
          if r["phase"] == "rl"}  # fmt: skip
    first = replay_step(real_run, 1, save_to=tmp_path / "after_1")  # from checkpoints/sft, fresh learner
    assert first.identical is None and first.metrics["train/skipped"] == 0.0
    assert {k: rl[1][k] for k in first.metrics} == {k: _as_recorded(v) for k, v in first.metrics.items()}
    last = replay_step(real_run, 2, checkpoint=tmp_path / "after_1")
    assert last.compared_with == real_run / "checkpoints" / "final"
    assert last.identical is True
    assert {k: rl[2][k] for k in last.metrics} == {k: _as_recorded(v) for k, v in last.metrics.items()}
    sft = load_for(real_run / "checkpoints" / "sft", HarmonyTokenizer.load_default()).state_dict()
    assert differing_tensors(sft, last.state_dict)  # the replayed steps did move the weights


def test_a_real_run_rescores_and_shows(real_run: Path) -> None:
    for step in (1, 2):
        episodes = read_step(step_path(real_run, step))
        rows = rescore(real_run, step)
        assert len(rows) == sum(t.failure is None for t in episodes)
        assert all(r.new_reward == r.stored_reward for r in rows)
    text = episodes_text(read_step(step_path(real_run, 2)), limit=2, step=2)
    assert "step 2: 2 of 4 episodes" in text and "turn 1" in text and "reward " in text
