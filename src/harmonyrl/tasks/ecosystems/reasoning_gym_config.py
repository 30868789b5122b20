"""The ``env`` config of ``env.name=reasoning_gym`` (docs/reasoning-gym.md): which reasoning-gym tasks, their knobs,
the split sizes, difficulty levels, and the scripted expert's two knobs. Reading it imports no environment; it
checks every setting against the installed reasoning-gym (:mod:`.reasoning_gym_datasets`) when validated."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

from harmonyrl.frozen import Frozen
from harmonyrl.tasks.ecosystems.packages import same_version, version_of
from harmonyrl.tasks.ecosystems.reasoning_gym_datasets import (
    DISTRIBUTION,
    Knob,
    check_task_names,
    dataset_config,
    max_level,
)

if TYPE_CHECKING:
    from harmonyrl.tasks.custom import Expert
    from harmonyrl.tasks.ecosystems.reasoning_gym import ReasoningGymFactory

P_TOOL = 0.8
"""The built-in experts' default ``p_tool`` (``tasks.config.P_TOOL``, not imported: ``tasks.config`` imports this
module; a test keeps them equal)."""
P_VERBOSE = 0.3
"""The built-in experts' default ``p_verbose`` (``tasks.config.P_VERBOSE``)."""


class ReasoningGymEnvConfig(Frozen):
    """reasoning-gym's procedural tasks graded by their own ``score_answer`` (docs/reasoning-gym.md; needs
    ``pip install 'harmonyrl[reasoning-gym]'``)."""

    name: Literal["reasoning_gym"] = "reasoning_gym"
    tasks: tuple[str, ...] = Field(("letter_counting",), min_length=1)
    """reasoning-gym task names, e.g. ``[chain_sum, leg_counting]``."""
    weights: tuple[float, ...] | None = None
    """Relative frequency of each of ``tasks`` in every split (null: equal)."""
    config: dict[str, dict[str, Knob]] = Field(default_factory=dict)
    """Knobs of each task's reasoning-gym config: ``env.config.chain_sum.max_terms=3``."""
    n_train: int = Field(2000, ge=1)
    """Training questions drawn."""
    n_val: int = Field(200, ge=0)
    """Validation questions drawn (for choosing settings; disjoint from train and test)."""
    n_test: int = Field(200, ge=1)
    """Held-out test questions drawn (reported once)."""
    levels: tuple[int, int] | None = None
    """Difficulty range (lowest, highest) of the drawn questions: each task's reasoning-gym curriculum at that
    level (for ``rl.curriculum``; docs/curriculum.md); null: the tasks' configs as given."""
    max_answer_chars: int | None = Field(None, ge=1)
    """Longest answer graded (longer ones score 0); null: four times the reference answer plus 16."""
    memory: bool = False
    """Add the ``remember`` / ``recall`` notes tools (:mod:`harmonyrl.envs.memory`) to every episode."""
    p_tool: float = Field(P_TOOL, ge=0, le=1)
    """Probability that the scripted expert gives the reference answer (otherwise a plausible wrong one)."""
    p_verbose: float = Field(P_VERBOSE, ge=0, le=1)
    """Probability that a right demonstration wraps the answer in a sentence (scored below 1)."""
    package_version: str = Field(default_factory=lambda: version_of(DISTRIBUTION))
    """The reasoning-gym version the questions are drawn with (recorded; another installed version is an error:
    its generators may draw other questions)."""

    def build_factory(self, seed: int) -> ReasoningGymFactory:
        """The questions of ``seed`` drawn from ``tasks``."""
        from harmonyrl.tasks.ecosystems.reasoning_gym import ReasoningGymFactory

        return ReasoningGymFactory(
            tasks=self.tasks,
            weights=self.weights,
            config=self.config,
            seed=seed,
            n_train=self.n_train,
            n_val=self.n_val,
            n_test=self.n_test,
            levels=self.levels,
            max_answer_chars=self.max_answer_chars,
        )

    def build_expert(self) -> Expert:
        """The reference-answer expert with this env's ``p_tool`` / ``p_verbose`` bound."""
        from harmonyrl.tasks.ecosystems.reasoning_gym import expert_demo

        return functools.partial(expert_demo, p_tool=self.p_tool, p_verbose=self.p_verbose)

    @model_validator(mode="after")
    def _known(self) -> ReasoningGymEnvConfig:
        try:
            self._check()
        except ValueError as e:  # a custom error: the message reads without pydantic's "Value error, "
            raise PydanticCustomError("reasoning_gym", "{reason}", {"reason": str(e)}) from None
        return self

    def _check(self) -> None:
        """Every setting against the installed reasoning-gym; the first problem as a one-line ``ValueError``."""
        same_version(self.package_version, "reasoning_gym", DISTRIBUTION, "reasoning-gym")
        check_task_names(self.tasks)
        if self.weights is not None and (len(self.weights) != len(self.tasks) or min(self.weights) <= 0):
            raise ValueError(f"env.weights must be {len(self.tasks)} positive numbers, one per task in env.tasks")
        for task in self.config:
            if task not in self.tasks:
                raise ValueError(f"env.config.{task}: '{task}' is not in env.tasks")
        if self.levels is not None:
            lo, hi = self.levels
            top = min(max_level(t) for t in self.tasks)
            if not 0 <= lo <= hi <= top:
                raise ValueError(f"env.levels must be (lowest, highest) with 0 <= lowest <= highest <= {top} "
                                 "(the lowest top level of these tasks' curricula)")  # fmt: skip
        for task in self.tasks:  # every knob checked before compute, at each level used
            for level in {None} if self.levels is None else set(range(self.levels[0], self.levels[1] + 1)):
                dataset_config(task, self.config.get(task, {}), 0, 1, level)
