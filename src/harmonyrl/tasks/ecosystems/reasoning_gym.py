"""reasoning-gym (PyPI ``reasoning-gym``): its procedural task generators as one harmonyrl environment.

``env.name=reasoning_gym env.tasks=[chain_sum,leg_counting] env.weights=[3,1] env.config.chain_sum.max_terms=3``

What is mapped to what:

* **tasks**: each of ``env.tasks`` is a reasoning-gym dataset (``reasoning_gym.create_dataset(name, …)``), its
  knobs set from ``env.config.<task>.<knob>`` (the dataset's own config dataclass: an unknown knob, or one its
  ``validate`` refuses, is a one-line error before compute). Each draw picks a task by ``env.weights`` (default
  equal) and takes that dataset's next item; the dataset's seed is derived from the run's ``seed``, the task's
  name and the difficulty level, so a run draws the same questions every time it is built.
* **splits**: a question's split is a hash of (task, question) (:mod:`.splits`): train, validation and test are
  disjoint whatever the seed: ``eval.split=validation`` while choosing settings, ``test`` (the default) reported
  once.
* **grader**: the dataset's own ``score_answer(answer, entry)`` on the ``final`` message, behind
  :mod:`.guard` (an empty, over-long or echoed answer scores 0 without asking it; a scorer that raises scores
  0). The reward is its score in [0, 1] (reasoning-gym gives partial credit on some tasks); ``correct`` (what
  ``eval/success`` counts) is a score of 1.
* **difficulty**: ``env.levels=[lo, hi]`` draws each question at a level L in lo..hi, every attribute of the
  task's reasoning-gym curriculum set to its L-th level (clamped to the attribute's last level; the band of
  that level only, reasoning-gym's ``UPPER_BOUND`` mode). The factory reports L (:meth:`difficulty`), so
  ``rl.curriculum`` buckets by it and ``rl.curriculum.start_levels`` opens harder levels as the run goes.
* **expert** (SFT warm start): :func:`expert_demo` answers with the item's reference answer (reasoning-gym ships
  one per item), deliberately imperfect like the built-in experts: with probability ``1 - p_tool`` a plausible
  wrong answer, with probability ``p_verbose`` the right one wrapped in a sentence (scored below 1).

Not supported: tasks whose items carry no reference answer cannot be demonstrated (their answers are empty; give
``sft.demos``), and reasoning-gym's ``composite`` dataset (use ``env.tasks`` and ``env.weights`` instead).
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Mapping, Sequence
from typing import Any

from harmonyrl.envs.loader import UserCodeError
from harmonyrl.envs.tools import Toolbox
from harmonyrl.envs.turns import ToolTurns, final_answer
from harmonyrl.tasks.ecosystems.guard import check_answer
from harmonyrl.tasks.ecosystems.reasoning_gym_datasets import Knob, check_task_names, dataset_config, registry
from harmonyrl.tasks.ecosystems.splits import three_way_split
from harmonyrl.tasks.guesses import VERBOSE_TEMPLATES, guess_answer
from harmonyrl.types import Message, Split, StepResult, Task, ToolSpec

INSTRUCTIONS = "Solve the problem. Answer on the final channel with only the answer, in the form the problem asks for."


# ---- tasks ---------------------------------------------------------------------------------------------------


def _seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:4], "big")


class _Draw:
    """One (task, level) dataset and the index of its next item."""

    def __init__(self, task: str, knobs: Mapping[str, Knob], seed: int, size: int, level: int | None) -> None:
        datasets, _ = registry()
        dataset_cls, _ = datasets[task]
        self.dataset = dataset_cls(config=dataset_config(task, knobs, _seed(seed, task, level), size, level))
        self.next = 0

    def item(self) -> dict[str, Any]:
        entry: dict[str, Any] = self.dataset[self.next]
        self.next += 1
        return entry


def _task_id(task: str, seed: int, split: Split, index: int) -> str:
    return f"rg-{task}-{seed}-{split}-{index:05d}"


class ReasoningGymFactory:
    """Questions drawn from reasoning-gym datasets into disjoint splits (module docstring)."""

    name = "reasoning_gym"

    def __init__(
        self,
        tasks: Sequence[str],
        weights: Sequence[float] | None = None,
        config: Mapping[str, Mapping[str, Knob]] | None = None,
        seed: int = 0,
        n_train: int = 2000,
        n_val: int = 200,
        n_test: int = 200,
        levels: tuple[int, int] | None = None,
        max_answer_chars: int | None = None,
    ) -> None:
        check_task_names(tasks)
        self.seed, self.max_answer_chars = seed, max_answer_chars
        knobs = dict(config or {})
        want: dict[Split, int] = {"train": n_train, "validation": n_val, "test": n_test}
        budget = 100 * sum(want.values()) + 1000
        draws: dict[tuple[str, int | None], _Draw] = {}
        out: dict[Split, list[Task]] = {"train": [], "validation": [], "test": []}
        self._entries: dict[str, tuple[str, dict[str, Any]]] = {}
        self._levels: dict[str, int] = {}
        rng, seen = random.Random(seed), set()
        for _ in range(budget):
            if all(len(out[s]) >= want[s] for s in out):
                break
            task = rng.choices(list(tasks), weights=list(weights) if weights else None)[0]
            level = None if levels is None else rng.randint(*levels)
            key = (task, level)
            if key not in draws:
                draws[key] = _Draw(task, knobs.get(task, {}), seed, budget, level)
            entry = draws[key].item()
            question = str(entry["question"])
            split = three_way_split(f"{task}:{question}")
            if (task, question) in seen or len(out[split]) >= want[split]:
                continue
            seen.add((task, question))
            task_id = _task_id(task, seed, split, len(out[split]))
            answer = "" if entry.get("answer") is None else str(entry["answer"])
            out[split].append(Task(task_id, question, answer, split))
            self._entries[task_id] = (task, entry)
            if level is not None:
                self._levels[task_id] = level
        else:
            have = ", ".join(f"{len(out[s])} {s}" for s in out)
            raise ValueError(f"env.tasks {list(tasks)}: could draw only {have} distinct questions; lower env.n_train "
                             "or widen the tasks' knobs")  # fmt: skip
        self._splits = {s: tuple(v) for s, v in out.items()}
        self._datasets = {task: d.dataset for (task, _), d in draws.items()}
        self._toolbox = Toolbox([])

    def tasks(self, split: Split) -> Sequence[Task]:
        return self._splits[split]

    def make(self, task: Task) -> ReasoningGymEnv:
        name, entry = self._entries[task.id]
        return ReasoningGymEnv(task, entry, self._datasets[name], self._toolbox, self.max_answer_chars)

    def difficulty(self, task: Task) -> int | None:
        """The task's curriculum level with ``levels`` set; None without."""
        return self._levels.get(task.id)

    def entry(self, task: Task) -> tuple[str, dict[str, Any]]:
        """(reasoning-gym task name, the dataset's item) behind ``task``."""
        return self._entries[task.id]


# ---- environment ---------------------------------------------------------------------------------------------


class ReasoningGymEnv:
    """One single-turn episode: the ``final`` message, past the guard, scored by the dataset's ``score_answer``."""

    def __init__(
        self, task: Task, entry: dict[str, Any], dataset: Any, toolbox: Toolbox, max_answer_chars: int | None
    ) -> None:
        self.task, self._entry, self._dataset = task, entry, dataset
        self._max_chars = max_answer_chars
        self._episode = ToolTurns(toolbox)  # empty: any tool call is an "unknown tool" observation

    @property
    def tools(self) -> Sequence[ToolSpec]:
        return ()

    @property
    def instructions(self) -> str:
        return INSTRUCTIONS

    async def reset(self) -> list[Message]:
        self._episode.reset()
        return [Message(role="user", content=self.task.prompt)]

    async def step(self, action: Sequence[Message]) -> StepResult:
        if (tool_turn := await self._episode.step(action)) is not None:
            return tool_turn
        answer = final_answer(action)
        verdict = "ok" if answer is None else check_answer(answer, self.task.prompt, self.task.answer, self._max_chars)
        score, grader_error = 0.0, False
        if answer is not None and verdict == "ok":
            try:
                score = min(1.0, max(0.0, float(self._dataset.score_answer(answer, self._entry))))
            except Exception:  # the answer made the scorer raise: the answer's doing, scored 0 (guard.py)
                grader_error = True
        info = {
            "correct": float(score >= 1.0),
            "score": score,
            "format_error": float(answer is None),
            "guarded": float(verdict != "ok"),
            "grader_error": float(grader_error),
        }
        return StepResult(reward=score, terminated=True, info=info)

    async def close(self) -> None:
        self._episode.done = True


# ---- scripted expert -----------------------------------------------------------------------------------------

_INT = re.compile(r"-?\d+")


def wrong_answer(reference: str, rng: random.Random) -> str:
    """A plausible wrong answer of the reference's shape: other digits for an integer, two words (or two
    characters) swapped otherwise, a character appended when nothing can be swapped."""
    if _INT.fullmatch(reference):
        return guess_answer(int(reference), rng)
    sep = ", " if ", " in reference else " "
    parts = reference.split(sep) if sep in reference else list(reference)
    for _ in range(8):
        i, j = rng.sample(range(len(parts)), 2) if len(parts) > 1 else (0, 0)
        swapped = list(parts)
        swapped[i], swapped[j] = swapped[j], swapped[i]
        candidate = (sep if sep in reference else "").join(swapped)
        if candidate != reference:
            return candidate
    return reference + rng.choice("0123456789x")


def expert_demo(task: Task, rng: random.Random, p_tool: float = 0.8, p_verbose: float = 0.3) -> list[Message]:
    """The assistant side of a demonstration: the reference answer on ``final``, imperfect on purpose (module
    docstring). A task without a reference answer is a one-line error (give ``sft.demos`` instead)."""
    if not task.answer:
        raise UserCodeError(f"reasoning-gym task '{task.id}' has no reference answer to demonstrate: use sft.demos")
    if rng.random() >= p_tool:
        return [Message(role="assistant", channel="final", content=wrong_answer(task.answer, rng))]
    verbose = p_verbose > 0 and rng.random() < p_verbose
    text = rng.choice(VERBOSE_TEMPLATES).format(task.answer) if verbose else task.answer
    return [Message(role="assistant", channel="final", content=text)]


def custom_factory(
    tasks: str,
    seed: int = 0,
    n_train: int = 2000,
    n_val: int = 200,
    n_test: int = 200,
    **knobs: Knob,
) -> ReasoningGymFactory:
    """The factory for ``env.name=custom env.factory=harmonyrl.tasks.ecosystems.reasoning_gym:custom_factory``
    (scalars only: ``tasks`` comma-separated, ``<task>__<knob>=value`` for ``env.config.<task>.<knob>``)."""
    names = [t.strip() for t in tasks.split(",") if t.strip()]
    config: dict[str, dict[str, Knob]] = {}
    for key, value in knobs.items():
        task, sep, knob = key.partition("__")
        if not sep:
            raise UserCodeError(f"env.kwargs.{key}: expected <task>__<knob>")
        config.setdefault(task, {})[knob] = value
    return ReasoningGymFactory(names, None, config, seed, n_train, n_val, n_test)
