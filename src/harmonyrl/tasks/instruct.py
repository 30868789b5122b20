"""Instruct: verifiable instruction following (IFEval-style). Write about a topic under 1-3 checkable constraints.

    factory = InstructFactory(seed=0)
    task = factory.tasks("train")[0]
    task.prompt   # 'Describe the night sky.\\nUse at most 45 words.\\nDo not use any commas.'
    task.answer   # a reference response that satisfies every constraint

A prompt is one request line ("Describe {topic}.") followed by one line per constraint
(:mod:`harmonyrl.tasks.constraints`: word bounds, keywords, a forbidden word, no commas, case, bullets,
paragraphs, exact start / end, JSON or quotes). The prompt is the task's only description of its
constraints, so the env, the expert and a task file all read them back with
:func:`~harmonyrl.tasks.constraints.parse_line`; there is no side table to fall out of sync.
``Task.answer`` is a reference response written by the same writer the expert uses: it is what
``check_env`` replays as the "correct" answer, and proof that every task is satisfiable.

Reward (:func:`~harmonyrl.envs.reward.compose_reward`): ``outcome`` is 1 when every constraint holds;
``format`` is the *fraction* that hold (in this env every constraint is a constraint on form, so the dense
shaping term is partial credit); ``tool_use`` is always 0 (no tools; a tool call gets an "unknown tool"
observation, the model's fault); ``step_cost`` as elsewhere. ``info["constraints_met"]`` logs the fraction
whatever the weights. Reference responses measure 43 tokens median, 101 at the 95th percentile and 173 at most
with the shipped tokenizer: raise ``rollout.max_new_tokens`` to ~192 (the default 64 cuts ~20 % of them).

**What counts as a response.** Most constraints are easy to meet by writing almost nothing: of the first 2000
generated tasks of seed 0, the empty answer met every constraint of 119 (a word maximum, a forbidden word, no
commas) and a copy of the prompt of 190; ``1`` is valid JSON, one capital letter is upper case. So before any
constraint is checked the answer must be a response (:func:`is_response`): at least :data:`MIN_WORDS` words
and :data:`MIN_DISTINCT_WORDS` different ones, and, for a generated task, every content word of its topic ("a
city at night": *city* and *night*), all counted after leaving out any run of words that copies a whole line
of the prompt (echoing the instructions is not writing). An answer that is not a response scores 0 on every
term, partial credit included, and logs ``info["not_a_response"]``. For a task-file request (free text) only
the length rules apply, and a ``max_words`` below :data:`MIN_WORDS` is refused when the file is read. Not
checked: that the words make sense together (a keyword salad about the topic that meets the constraints
scores 1).

Splits: the canonical key is the request, the topic and the *set* of constraint lines, so reordering the constraints
cannot carry a held-out task into train; validation (``n_val``, drawn after train and test, which it leaves
unchanged) comes from :func:`~harmonyrl.envs.taskfile.draw_three`.

Task file (``tasks_file``), one JSON object per line::

    {"id": "if-1", "split": "train", "prompt": "Describe a harbour at dawn.",  # or "validation", "test"
     "constraints": [{"kind": "max_words", "args": {"n": 40}}, {"kind": "no_commas", "args": {}}]}

``prompt`` is the one-line request; the constraint lines are appended to it. Kinds and ``args`` are listed in
:func:`~harmonyrl.tasks.constraints.from_json`. A conflicting set, an unknown kind or key, a duplicate id or a
prompt in two splits is one ``path:line: ...`` error. A file without validation rows has ~10 % of its train rows
carved as validation (:func:`~harmonyrl.envs.taskfile.split_file`).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path

from harmonyrl.envs.reward import OUTCOME_ONLY, RewardWeights, compose_reward
from harmonyrl.envs.taskfile import SPLITS, InfeasibleDraw, TaskFileError, draw_three, split_file
from harmonyrl.envs.tools import Toolbox
from harmonyrl.envs.turns import ToolTurns, final_answer
from harmonyrl.tasks.constraints import CONFLICTS, KINDS, Constraint, Kind, from_json, parse_line, validate
from harmonyrl.tasks.instruct_response import GENERIC_TOPIC, MIN_WORDS, is_response
from harmonyrl.tasks.instruct_writer import END_PHRASES, WriterError, write
from harmonyrl.types import Message, Split, StepResult, Task, ToolSpec

INSTRUCTIONS = "Follow every instruction in the user's message exactly. Answer on the final channel."
REQUESTS = ("Write a short note about {topic}.", "Describe {topic}.", "Tell me about {topic}.",
            "Write a few lines on {topic}.")  # fmt: skip
TOPICS = ("the sea", "a rainy morning", "an old bicycle", "the night sky", "a busy market", "a mountain walk",
          "a favourite book", "a quiet library", "the first snow", "a long train ride", "a small garden",
          "a city at night")  # fmt: skip
KEYWORDS = ("bright", "silence", "memory", "promise", "window", "river", "golden", "whisper", "ladder", "harbor")
FORBIDDEN = ("very", "really", "good", "nice", "beautiful", "amazing", "great", "lovely")
START_WORDS = ("Honestly", "Today", "Imagine", "Sometimes", "Listen")
VERBOSE_PREAMBLE = "Sure! Here is my answer:\n"
# ---- tasks -------------------------------------------------------------------------------------------


def _constraint(kind: Kind, r: random.Random) -> Constraint:
    match kind:
        case "min_words":
            return Constraint(kind, n=r.choice((10, 15, 20, 25)))
        case "max_words":
            return Constraint(kind, n=r.choice((35, 45, 60)))
        case "bullets":
            return Constraint(kind, n=r.randint(2, 4))
        case "paragraphs":
            return Constraint(kind, n=r.randint(2, 3))
        case "include_keywords":
            return Constraint(kind, words=tuple(r.sample(KEYWORDS, r.randint(1, 3))))
        case "forbid_word":
            return Constraint(kind, words=(r.choice(FORBIDDEN),))
        case "start_with":
            return Constraint(kind, words=(r.choice(START_WORDS),))
        case "end_with":
            return Constraint(kind, phrase=r.choice(END_PHRASES))
    return Constraint(kind)


def _draw_constraints(r: random.Random) -> list[Constraint]:
    want = r.choice((1, 2, 2, 3, 3))
    chosen: list[Kind] = []
    for kind in r.sample(KINDS, len(KINDS)):
        if len(chosen) < want and not any(frozenset((kind, k)) in CONFLICTS for k in chosen):
            chosen.append(kind)
    return [_constraint(k, r) for k in chosen]


def render_prompt(request: str, constraints: Sequence[Constraint]) -> str:
    return "\n".join([request, *(c.phrase_line for c in constraints)])


def task_key(request: str, constraints: Sequence[Constraint]) -> str:
    return f"{request}|{sorted(c.phrase_line for c in constraints)}"


def topic_of(request: str) -> str:
    """The topic of a generated request line; a generic one for hand-written requests (task files)."""
    for template in REQUESTS:
        head, _, tail = template.partition("{topic}")
        if request.startswith(head) and request.endswith(tail) and len(request) > len(head) + len(tail):
            return request[len(head) : len(request) - len(tail)]
    return GENERIC_TOPIC


def _draw(r: random.Random) -> tuple[str, Callable[[], tuple[str, str]]]:
    request = r.choice(REQUESTS).format(topic=r.choice(TOPICS))
    constraints = _draw_constraints(r)
    key = task_key(request, constraints)

    def make() -> tuple[str, str]:
        try:
            return render_prompt(request, constraints), write(constraints, topic_of(request), random.Random(key))
        except WriterError as e:  # e.g. 4 bullets in at most 35 words with two keywords: not posed
            raise InfeasibleDraw(str(e)) from e

    return key, make


@lru_cache(maxsize=65536)
def parse_task(prompt: str) -> tuple[str, tuple[Constraint, ...]]:
    """(request line, constraints) of an instruct prompt; ``ValueError`` if a line is not a constraint."""
    request, *lines = prompt.split("\n")
    constraints = []
    for line in lines:
        c = parse_line(line)
        if c is None:
            raise ValueError(f"not an instruct prompt: line {line[:80]!r} states no known constraint")
        constraints.append(c)
    validate(constraints)
    return request, tuple(constraints)


def _file_task(row: object) -> Task:
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got {type(row).__name__}")
    keys = {"id", "split", "prompt", "constraints"}
    if set(row) != keys:
        raise ValueError(f"keys must be exactly {sorted(keys)}, got {sorted(row)}")
    task_id, split, request, rows = row["id"], row["split"], row["prompt"], row["constraints"]
    if not isinstance(task_id, str) or not task_id.strip():
        raise ValueError(f"'id' must be a non-empty string, got {task_id!r}")
    if split not in SPLITS:
        raise ValueError(f'\'split\' must be "train", "validation" or "test", got {split!r}')
    if not isinstance(request, str) or not request.strip() or "\n" in request:
        raise ValueError("'prompt' must be a non-empty single line (the request; constraint lines are added)")
    if not isinstance(rows, list):
        raise ValueError('\'constraints\' must be a list of {"kind", "args"} objects')
    constraints = [from_json(c) for c in rows]
    validate(constraints)
    if any(c.kind == "max_words" and c.n < MIN_WORDS for c in constraints):
        raise ValueError(f"max_words must be at least {MIN_WORDS}: a shorter answer is not a response")
    prompt = render_prompt(request.strip(), constraints)
    answer = write(constraints, topic_of(request), random.Random(task_key(request, constraints)))
    return Task(task_id, prompt, answer, split)


def read_instruct_jsonl(path: str | Path) -> list[Task]:
    """Every task of an instruct task file; :class:`TaskFileError` (``path:line: what``) on any mistake."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise TaskFileError(f"{path}: cannot read task file ({e})") from None
    tasks: list[Task] = []
    first: dict[str, int] = {}
    splits: dict[str, tuple[str, int]] = {}
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            task = _file_task(json.loads(line))
        except json.JSONDecodeError as e:
            raise TaskFileError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
        except ValueError as e:  # includes WriterError: bounds too tight for the shape asked for
            raise TaskFileError(f"{path}:{lineno}: {e}"[:300]) from None
        if task.id in first:
            raise TaskFileError(f"{path}:{lineno}: duplicate id {task.id!r} (first on line {first[task.id]})")
        seen = splits.setdefault(task.prompt, (task.split, lineno))
        if seen[0] != task.split:
            raise TaskFileError(f"{path}:{lineno}: same task also in the {seen[0]} split (line {seen[1]})")
        first[task.id] = lineno
        tasks.append(task)
    return tasks


# ---- environment -------------------------------------------------------------------------------------


class InstructEnv:
    """One single-turn episode: the ``final`` message is checked against the task's constraints."""

    def __init__(self, task: Task, weights: RewardWeights, toolbox: Toolbox) -> None:
        self.task = task
        request, self.constraints = parse_task(task.prompt)
        self._topic = topic_of(request)
        self._weights = weights
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
        on_final = answer is not None
        responded = answer is not None and is_response(answer, self._topic, self.task.prompt)
        met = [c.holds(answer) for c in self.constraints] if answer is not None and responded else []
        fraction = sum(met) / len(self.constraints)
        correct = responded and all(met)
        turns = float(self._episode.turns)
        terms = {"outcome": float(correct), "format": fraction, "tool_use": 0.0, "step_cost": -turns}
        reward, parts = compose_reward(terms, self._weights.as_dict())
        info = {
            "correct": float(correct),
            "constraints_met": fraction,
            "format_error": float(not on_final),
            "not_a_response": float(on_final and not responded),
            "turns": turns,
            **parts,
        }
        return StepResult(reward=reward, terminated=True, info=info)

    async def close(self) -> None:
        self._episode.done = True


class InstructFactory:
    """Generated (or file) instruction-following tasks; no tools."""

    name = "instruct"

    def __init__(
        self,
        seed: int = 0,
        n_train: int = 5000,
        n_test: int = 200,
        weights: RewardWeights = OUTCOME_ONLY,
        tasks_file: str | Path | None = None,
        n_val: int = 0,
    ) -> None:
        if n_train < 0 or n_test < 0 or n_val < 0:
            raise ValueError("n_train, n_val and n_test must be >= 0")
        self.seed = seed
        self.weights = weights
        if tasks_file is None:
            self._splits = draw_three(self.name, seed, n_train, n_val, n_test, _draw)
        else:
            self._splits = split_file(read_instruct_jsonl(tasks_file), n_train, n_val, n_test)
        self._toolbox = Toolbox([])

    def tasks(self, split: Split) -> Sequence[Task]:
        return self._splits.of(split)

    def make(self, task: Task) -> InstructEnv:
        return InstructEnv(task, self.weights, self._toolbox)


def expert_demo(task: Task, rng: random.Random, p_tool: float = 0.8, p_verbose: float = 0.0) -> list[Message]:
    """One final message: compliant with probability ``p_tool``, otherwise breaking one random constraint.

    ``p_tool`` keeps its name from the tool envs (the probability that the expert "does the job properly");
    with probability ``p_verbose`` the response opens with a chatty preamble (:data:`VERBOSE_PREAMBLE`),
    which breaks exact starts, JSON / quote wrapping and tight word limits, as chat preambles do.
    """
    request, constraints = parse_task(task.prompt)
    broken = rng.choice(constraints).kind if rng.random() >= p_tool else None
    text = write(constraints, topic_of(request), random.Random(rng.random()), broken)
    if p_verbose > 0 and rng.random() < p_verbose:  # p_verbose 0 draws nothing: demo streams stay put
        text = VERBOSE_PREAMBLE + text
    return [Message(role="assistant", channel="final", content=text)]
