"""The RL loop's task source: the plain stream's position (also from checkpoints that predate it) and a
curriculum resumed from the state a checkpoint saved."""

from __future__ import annotations

from pathlib import Path

import pytest

from harmonyrl.config import load_config
from harmonyrl.errors import CheckpointError
from harmonyrl.rl.task_choice import task_source
from harmonyrl.rollout.curriculum import Curriculum
from harmonyrl.rollout.task_stream import SequentialTasks
from harmonyrl.run.resume import Progress
from harmonyrl.run.state import Rngs, RunState
from harmonyrl.tasks.calculator import CalculatorFactory

FACTORY = CalculatorFactory(seed=0, n_train=50, n_test=5, levels=(1, 3))


def _saved(step: int, **state: object) -> Progress:
    plain = {"phase": "rl", "step": step, "lines": {}, "optimizer": {}, "learner": {}, **Rngs.capture().to_plain()}
    return Progress(RunState.from_plain(plain | state, "unused"), Path("unused"))


def test_the_plain_stream_is_the_old_task_choice_step_by_step() -> None:
    config = load_config(None, ["rollout.tasks_per_step=8"])
    source = task_source(config, FACTORY, None)
    tasks = FACTORY.tasks("train")
    for step in range(12):  # wraps around the 50 tasks at step 6
        offset = (step * 8) % len(tasks)  # the loop's formula before task sources
        assert source.draw(step, 8) == [tasks[(offset + i) % len(tasks)] for i in range(8)]


def test_a_checkpoint_without_a_position_resumes_at_step_times_tasks_per_step() -> None:
    config = load_config(None, ["rollout.tasks_per_step=8"])
    source = task_source(config, FACTORY, _saved(3))
    assert isinstance(source, SequentialTasks) and source.cursor == 24
    assert task_source(config, FACTORY, _saved(3, sampling={"kind": "sequential", "cursor": 31})).state() == {
        "kind": "sequential",
        "cursor": 31,
    }


def test_a_curriculum_resumes_from_its_saved_state() -> None:
    config = load_config(None, ["env.levels=[1,3]", "rl.curriculum.start_levels=1"])
    first = task_source(config, FACTORY, None)
    assert isinstance(first, Curriculum)
    first.draw(0, 5)
    resumed = task_source(config, FACTORY, _saved(1, sampling=first.state()))
    assert resumed.state() == first.state()
    assert resumed.draw(1, 7) == first.draw(1, 7)
    with pytest.raises(CheckpointError, match="no curriculum state"):
        task_source(config, FACTORY, _saved(1))
