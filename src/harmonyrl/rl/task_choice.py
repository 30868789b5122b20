"""The RL loop's task source: the plain task stream, or a curriculum (``rl.curriculum``), resumed from a checkpoint.

A checkpoint from before task sources were saved holds no ``sampling`` state; its stream position is then the
one every run had, ``step × tasks_per_step`` (the plain stream could not take more than that per step).
"""

from __future__ import annotations

from harmonyrl.config import RunConfig
from harmonyrl.envs.base import EnvFactory
from harmonyrl.envs.loader import UserCodeError
from harmonyrl.errors import CheckpointError
from harmonyrl.rollout.curriculum import Curriculum, Difficulty
from harmonyrl.rollout.task_stream import SequentialTasks, SourceState, TaskSource
from harmonyrl.run.resume import Progress


def difficulty_of(factory: EnvFactory) -> Difficulty | None:
    """The factory's ``difficulty(task)`` method, if it has one (envs that report task difficulty)."""
    method = getattr(factory, "difficulty", None)
    return method if callable(method) else None


def task_source(config: RunConfig, factory: EnvFactory, saved: Progress | None) -> TaskSource:
    """The source of the RL steps' training tasks, at the position ``saved`` (an RL checkpoint) recorded."""
    tasks = factory.tasks("train")
    state: SourceState | None = saved.state.parts.sampling if saved is not None else None
    if config.rl.curriculum is None:
        if state is None:  # a fresh run, or a checkpoint written before the position was saved
            return SequentialTasks(tasks, saved.step * config.rollout.tasks_per_step if saved is not None else 0)
        position = state.get("cursor")
        if state.get("kind") != "sequential" or not isinstance(position, int):
            raise CheckpointError("the checkpoint's task position is not the plain stream's: resume with its config")
        return SequentialTasks(tasks, position)
    try:
        curriculum = Curriculum(tasks, difficulty_of(factory), config.rl.curriculum, config.seed)
    except ValueError as e:  # start_levels on a custom env without difficulty (config/run.py checks the built-in ones)
        raise UserCodeError(str(e)) from None
    if saved is not None:
        if state is None or state.get("kind") != "curriculum":
            raise CheckpointError("the checkpoint holds no curriculum state: resume with the config it was run with")
        curriculum.load(state)
    return curriculum
