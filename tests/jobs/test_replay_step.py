"""Replaying a recorded RL step reproduces its update bit for bit; re-scoring gives the stored rewards back.

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
from harmonyrl.jobs.replay import ReplayError, differing_tensors, replay_step, replay_update, rescore
from harmonyrl.rl.learner import Learner
from harmonyrl.rollout.show import episodes_text
from harmonyrl.rollout.store import RolloutFileError, list_steps, read_step, step_path, write_step
from harmonyrl.run.checkpoint import save_checkpoint
from harmonyrl.run.resume import save_progress
from harmonyrl.run.setup import load_for, make_factory, make_model, rl_start_model, setup_process
from harmonyrl.run.state import PhaseState
from harmonyrl.tasks.arith import calculator
from harmonyrl.tasks.calculator import expression_of
from harmonyrl.telemetry.episodes import episode_to_json
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
        save_progress(path, model, "rl", step, learner.optimizer, parts=PhaseState(learner=learner.rule.state_dict()))
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


def test_without_a_checkpoint_before_the_step_the_earlier_steps_are_replayed_first(run: Run) -> None:
    chained = replay_step(run.path, 2)  # checkpoints/last is at step 2: step 1 is replayed from its episodes first
    assert chained.chained == 1 and chained.metrics == run.metrics[1] and chained.identical is True
    _assert_bit_equal(chained.state_dict, run.after[1])
    assert chained.recorded is None and chained.matches_metrics is None  # this fixture writes no metrics.jsonl


def test_a_missing_earlier_record_or_a_checkpoint_at_the_wrong_step_is_one_line(run: Run, tmp_path: Path) -> None:
    copy = tmp_path / "r"
    shutil.copytree(run.path, copy)
    step_path(copy, 1).unlink()
    with pytest.raises(CheckpointError, match=r"replays steps 1-1 first, but '.*step_00001\.parquet' is missing"):
        replay_step(copy, 2)
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
REAL = tiny_run("threads=1", "rl.steps=3", "rl.skip_zero_variance_groups=false", "rl.entropy_coef=0.01")


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
    assert list_steps(real_run) == [1, 2, 3]
    lines = (real_run / "rollouts" / "episodes.jsonl").read_text().splitlines()
    stored = [episode_to_json(t, s) for s in (1, 2, 3) for t in read_step(step_path(real_run, s))]
    assert [json.loads(line) for line in lines] == json.loads(json.dumps(stored))  # same episodes, same order
    rl = {r["step"]: r for r in map(json.loads, (real_run / "metrics.jsonl").read_text().splitlines())
          if r["phase"] == "rl"}  # fmt: skip
    first = replay_step(real_run, 1, save_to=tmp_path / "after_1")  # from checkpoints/sft, fresh learner
    assert first.identical is None and first.metrics["train/skipped"] == 0.0
    assert {k: rl[1][k] for k in first.metrics} == {k: _as_recorded(v) for k, v in first.metrics.items()}
    middle = replay_step(real_run, 2, checkpoint=tmp_path / "after_1", save_to=tmp_path / "after_2")
    assert middle.identical is None and middle.matches_metrics is True
    assert {k: rl[2][k] for k in middle.metrics} == {k: _as_recorded(v) for k, v in middle.metrics.items()}
    last = replay_step(real_run, 3, checkpoint=tmp_path / "after_2")
    assert last.compared_with == real_run / "checkpoints" / "final"
    assert last.identical is True and last.matches_metrics is True
    sft = load_for(real_run / "checkpoints" / "sft", HarmonyTokenizer.load_default()).state_dict()
    assert differing_tensors(sft, last.state_dict)  # the replayed steps did move the weights


def test_a_middle_step_without_a_checkpoint_matches_metrics_jsonl(real_run: Path) -> None:
    """The run keeps no checkpoint before step 2: steps 1 is replayed from its episodes, then step 2, and every
    metric the update computes equals the step's row in metrics.jsonl."""
    middle = replay_step(real_run, 2)
    assert middle.chained == 1 and middle.identical is None  # no checkpoint of the weights after step 2 either
    assert middle.recorded is not None and middle.recorded.keys() == middle.metrics.keys()
    assert middle.matches_metrics is True and middle.metric_diffs == []
    assert middle.metrics["train/skipped"] == 0.0 and middle.metrics["train/grad_norm"] > 0  # a real update
    last = replay_step(real_run, 3)  # chained through 1 and 2, then compared bit for bit with final
    assert (last.chained, last.identical, last.matches_metrics) == (2, True, True)


def test_a_replay_that_differs_from_metrics_jsonl_says_which_metric(real_run: Path, tmp_path: Path) -> None:
    copy = tmp_path / "r"
    shutil.copytree(real_run, copy)
    rows = [json.loads(line) for line in (copy / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        if row["phase"] == "rl" and row["step"] == 1:
            row["train/loss"] += 1e-9
    (copy / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = replay_step(copy, 1)
    assert result.matches_metrics is False and [k for k, _, _ in result.metric_diffs] == ["train/loss"]


def test_a_real_run_rescores_and_shows(real_run: Path) -> None:
    for step in (1, 2):
        episodes = read_step(step_path(real_run, step))
        rows = rescore(real_run, step)
        assert len(rows) == sum(t.failure is None for t in episodes)
        assert all(r.new_reward == r.stored_reward for r in rows)
    text = episodes_text(read_step(step_path(real_run, 2)), limit=2, step=2)
    assert "step 2: 2 of 4 episodes" in text and "turn 1" in text and "reward " in text
