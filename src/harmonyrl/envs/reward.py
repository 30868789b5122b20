"""Reward composition, and the "use tools, then answer on final" episode every answer-graded env shares.

A reward is a weighted sum of named terms, each a score in [0, 1] or a cost <= 0::

    reward, info = compose_reward(terms.as_dict(), weights.as_dict())
    # info == {"reward/outcome": 1.0, "reward/format": 0.0, ...}: each weighted term, logged separately

Dense versus sparse is only a matter of which weights are non-zero: the default
``RewardWeights()`` is the plain outcome reward (1 for the exact answer, else 0), so a run's reward and its
``correct`` success metric stay the same number. Shaping terms are opt-in:

* ``format``: answered on the ``final`` channel with the bare answer (right or wrong) — teaches the output form;
* ``tool_use``: made at least one well-formed tool call — rewards trying the tool at all;
* ``step_cost``: minus the number of turns taken, so its weight is the price of one turn.

Positive weights must sum to at most 1 and the total is clipped at 0, so the reward stays in [0, 1]: the range
``check_env`` enforces and group baselines assume. Clipping at 0 means a step cost only discounts episodes
that earned something, which is the intent (fewer turns for the same answer), not a penalty for trying.

:class:`AnswerEnv` lives here rather than in each env because retool, sql (and any env whose task is
"call tools, answer with one exact value") differ only in their tools, instructions and tasks; one episode
class keeps their failure semantics and ``info`` keys identical.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

from harmonyrl.envs.tools import Toolbox
from harmonyrl.envs.turns import ToolTurns, final_answer
from harmonyrl.types import Message, StepResult, Task, ToolSpec

_INTEGER = re.compile(r"-?\d+")


@dataclass(frozen=True)
class RewardTerms:
    """The raw terms of one finished episode (before weighting)."""

    outcome: float
    """1.0 for the exact answer, else 0.0."""
    format: float
    """1.0 when the final message is the bare answer (see :func:`is_bare`), right or wrong."""
    tool_use: float
    """1.0 when at least one tool call was well-formed (the tool ran), else 0.0."""
    step_cost: float
    """Minus the number of turns taken (a cost, hence <= 0), so every weight reads as "more is stronger"."""

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class RewardWeights:
    """How much each term of :class:`RewardTerms` counts. The default is the sparse outcome reward."""

    outcome: float = 1.0
    format: float = 0.0
    tool_use: float = 0.0
    step_cost: float = 0.0
    """Reward subtracted per turn (a correct two-turn episode earns ``outcome - 2 * step_cost``)."""

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"reward weight {name} must be a finite number >= 0, got {value!r}")
        if (total := self.outcome + self.format + self.tool_use) > 1 + 1e-9:
            raise ValueError(f"reward weights outcome + format + tool_use must sum to <= 1, got {total:g}")

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


OUTCOME_ONLY = RewardWeights()
"""The sparse default: reward 1 for the exact answer, else 0."""


def compose_reward(terms: Mapping[str, float], weights: Mapping[str, float]) -> tuple[float, dict[str, float]]:
    """(reward clipped to [0, 1], ``{"reward/<term>": weight * value}`` for every term).

    A term without a weight counts 0 but is still logged, so every episode of an env has the same ``info``
    keys and batch means are well defined. A weight for a term that does not exist is a configuration
    mistake (a typo would otherwise silently give a sparse reward) and raises ``ValueError``.
    """
    unknown = sorted(set(weights) - set(terms))
    if unknown:
        raise ValueError(f"unknown reward term(s) {unknown}; known: {sorted(terms)}")
    parts = {f"reward/{name}": float(weights.get(name, 0.0)) * float(value) for name, value in terms.items()}
    total = math.fsum(parts.values())
    if not math.isfinite(total):
        raise ValueError(f"reward is not finite: {parts}")
    return min(1.0, max(0.0, total)), parts


def _strip(content: str) -> str:
    text = content.strip()
    return text[:-1] if text.endswith(".") else text


def exact_match(answer: str, content: str) -> bool:
    """Exact match, tolerating only surrounding whitespace and one trailing period (as the calculator does)."""
    return _strip(content) == answer


def is_bare(answer: str, content: str) -> bool:
    """The content is shaped like the answer and nothing more: an integer for integer answers, otherwise one
    line with no more words than the answer. "The answer is 42." is not bare; "41" is (a wrong bare answer)."""
    text = _strip(content)
    if _INTEGER.fullmatch(answer):
        return _INTEGER.fullmatch(text) is not None
    return bool(text) and "\n" not in text and len(text.split()) <= len(answer.split())


Evidence = Callable[[str, Sequence[tuple[Message, Message]]], bool]
"""``evidence(answer, results)``: whether the episode's tool results (``(call, observation)`` of every call that ran)
show where the right answer came from. An env whose answer must be derived with its tools passes one to
:class:`AnswerEnv`, so a right answer guessed without that derivation earns nothing."""


class AnswerEnv:
    """One episode: tool calls are observations (or environment failures), a ``final`` message is graded.

    Terminal ``info`` always has the same keys (``correct``, ``format_error``, ``tool_calls``, ``turns`` and
    ``reward/<term>``, plus ``ungrounded`` with an ``evidence`` check); ``correct`` is what ``Trajectory.success``
    reads, whatever the weights. With ``evidence``, an exact answer counts only if ``evidence`` accepts it;
    ``ungrounded`` is 1 for an exact answer it rejected (a lucky guess), so guessing stays visible in metrics.
    """

    def __init__(
        self, task: Task, toolbox: Toolbox, instructions: str, weights: RewardWeights, evidence: Evidence | None = None
    ) -> None:
        self.task = task
        self._episode = ToolTurns(toolbox)
        self._instructions = instructions
        self._weights = weights
        self._evidence = evidence

    @property
    def tools(self) -> Sequence[ToolSpec]:
        return self._episode.toolbox.specs

    @property
    def instructions(self) -> str:
        return self._instructions

    async def reset(self) -> list[Message]:
        self._episode.reset()
        return [Message(role="user", content=self.task.prompt)]

    async def step(self, action: Sequence[Message]) -> StepResult:
        if (tool_turn := await self._episode.step(action)) is not None:
            return tool_turn
        answer = final_answer(action)
        on_final, content = answer is not None, answer or ""
        exact = on_final and exact_match(self.task.answer, content)
        correct = exact and (self._evidence is None or self._evidence(self.task.answer, self._episode.results))
        terms = RewardTerms(
            outcome=float(correct),
            format=float(on_final and is_bare(self.task.answer, content)),
            tool_use=float(self._episode.tools_ran > 0),
            step_cost=-float(self._episode.turns),
        )
        reward, parts = compose_reward(terms.as_dict(), self._weights.as_dict())
        info = {
            "correct": float(correct),
            "format_error": float(not on_final),
            "tool_calls": float(self._episode.tool_calls),
            "turns": float(self._episode.turns),
            **parts,
        }
        if self._evidence is not None:
            info["ungrounded"] = float(exact and not correct)
        return StepResult(reward=reward, terminated=True, info=info)

    async def close(self) -> None:
        self._episode.done = True
