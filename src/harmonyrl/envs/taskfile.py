"""Where a factory's tasks come from: a JSONL task file, or prefix-stable generation with hash-disjoint splits.

Task file schema — one JSON object per line (blank lines are skipped)::

    {"id": "shop-0001", "prompt": "How many orders ...?", "answer": "17", "split": "train"}

* ``id``: non-empty string, unique in the file;
* ``prompt``: non-empty string, the user message;
* ``answer``: string (an integer is accepted and kept as its decimal text), what the env grades against;
* ``split``: ``"train"``, ``"validation"`` or ``"test"``; a prompt may not appear in two splits (a leaked problem).

Other keys are errors, so a misspelt ``"anwser"`` fails loudly instead of loading tasks without answers.
Every error is one line starting ``path:line:``, the form editors and terminals jump to.

Generation (:func:`draw_splits`) assigns a problem to a split by a hash of its *canonical key* (what the
problem is, not how it is worded), independent of the seed, so no seed and no rewording puts a test problem in
train. Every draw consumes the same randomness whether it is kept or not, so the first k tasks of a split do
not depend on ``n_train`` / ``n_test`` (prefix stability), as in :mod:`harmonyrl.tasks.calculator`.

**Validation** (:func:`draw_validation`): ``n_val`` more tasks, drawn after train and test from a stream of their
own (:func:`validation_rng`), so train and test are exactly what they were before validation existed. A
validation problem's key is in the train part of the key space (never a test problem, for any ``n_test``) and is
none of this run's train keys, so the three splits are disjoint by the canonical key. A task file's validation is
its ``"split": "validation"`` rows; a file without any (and a user's factory without a validation split) gets
one carved from its train tasks by a hash of each prompt (:func:`carve_validation`, ~10 %), which leaves those
out of train.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from collections.abc import Callable, Sequence, Set
from pathlib import Path
from typing import Literal, NamedTuple

from harmonyrl.errors import UserError
from harmonyrl.types import Split, Task

SPLITS: tuple[Split, ...] = ("train", "validation", "test")
_KEYS = frozenset({"id", "prompt", "answer", "split"})


class TaskFileError(UserError, ValueError):
    """A malformed task file; the message is ``path:line: what is wrong``."""


_TEST_BUCKETS = 5  # out of 100: ~5% of a problem space is test-only, for every seed
_CARVED_BUCKETS = 10  # out of 100: the share of a train split carved as validation where there is none


def split_of(key: str) -> Literal["train", "test"]:
    """A problem's split from a hash of its canonical key: disjoint by construction, independent of the seed."""
    bucket = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % 100
    return "test" if bucket < _TEST_BUCKETS else "train"


def _parse_line(where: str, text: str) -> Task:
    try:
        row = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        raise TaskFileError(f"{where}: not valid JSON ({getattr(e, 'msg', e)})") from None
    if not isinstance(row, dict):
        raise TaskFileError(f"{where}: expected a JSON object, got {type(row).__name__}")
    if missing := sorted(_KEYS - set(row)):
        raise TaskFileError(f"{where}: missing key(s) {missing}; each line needs {sorted(_KEYS)}")
    if extra := sorted(set(row) - _KEYS):
        raise TaskFileError(f"{where}: unknown key(s) {extra}; allowed: {sorted(_KEYS)}")
    answer = row["answer"]
    if isinstance(answer, int) and not isinstance(answer, bool):
        answer = str(answer)
    for key, value in (("id", row["id"]), ("prompt", row["prompt"]), ("answer", answer)):
        if not isinstance(value, str) or (key != "answer" and not value.strip()):
            raise TaskFileError(f"{where}: {key!r} must be a non-empty string, got {value!r}"[:300])
    if row["split"] not in SPLITS:
        raise TaskFileError(f'{where}: \'split\' must be "train", "validation" or "test", got {row["split"]!r}'[:300])
    return Task(id=row["id"], prompt=row["prompt"], answer=answer, split=row["split"])


def read_tasks_jsonl(path: str | Path) -> list[Task]:
    """Every task in the file, validated as a whole (unique ids, no prompt in both splits)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise TaskFileError(f"{path}: cannot read task file ({e.strerror or e})") from None
    tasks: list[Task] = []
    first_line: dict[str, int] = {}
    prompt_split: dict[str, tuple[Split, int]] = {}
    for lineno, line in enumerate(raw.splitlines(), start=1):
        where = f"{path}:{lineno}"
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as e:
            raise TaskFileError(f"{where}: not UTF-8 ({e.reason} at byte {e.start})") from None
        if not text.strip():
            continue
        task = _parse_line(where, text)
        if task.id in first_line:
            raise TaskFileError(f"{where}: duplicate id {task.id!r} (first on line {first_line[task.id]})"[:300])
        seen = prompt_split.setdefault(task.prompt, (task.split, lineno))
        if seen[0] != task.split:
            raise TaskFileError(f"{where}: prompt is also in the {seen[0]} split (line {seen[1]}): a leaked problem")
        first_line[task.id] = lineno
        tasks.append(task)
    return tasks


def load_tasks_jsonl(path: str | Path, split: Split) -> list[Task]:
    """The tasks of one split, in file order. Raises :class:`TaskFileError` (``path:line: ...``) on bad input."""
    if split not in SPLITS:
        raise ValueError(f"split must be 'train', 'validation' or 'test', got {split!r}")
    return [t for t in read_tasks_jsonl(path) if t.split == split]


class TooFewProblems(UserError, ValueError):
    """An env asked for more distinct generated problems than its settings allow (e.g. a 3x3 maze)."""


class InfeasibleDraw(ValueError):
    """Raised by a draw's ``make`` when the generator cannot pose the problem it drew (e.g. no reference answer
    meets the drawn constraints): the problem is skipped and the next one drawn."""


Draw = Callable[[random.Random], tuple[str, Callable[[], tuple[str, str]]]]
"""One problem from the generator: ``(canonical key, make)``, where ``make()`` gives ``(prompt, answer)``.
All randomness must be drawn before returning (``make`` only renders / computes): that is what keeps
generation prefix-stable when ``make`` is only called for kept problems."""


class Splits(NamedTuple):
    """The three splits of a factory, disjoint by the canonical key."""

    train: tuple[Task, ...]
    validation: tuple[Task, ...]
    test: tuple[Task, ...]

    def of(self, split: Split) -> tuple[Task, ...]:
        """The tasks of ``split`` (an unknown split is a one-line ``ValueError``)."""
        if split not in SPLITS:
            raise ValueError(f"split must be 'train', 'validation' or 'test', got {split!r}")
        return self.train if split == "train" else self.validation if split == "validation" else self.test


def validation_rng(name: str, seed: int) -> random.Random:
    """The validation split's own stream: nothing train or test draw depends on it."""
    return random.Random(f"{name}:{seed}:validation")


def draw_validation(
    name: str, seed: int, n_val: int, rng: random.Random, draw: Draw, taken: Set[str], space_key: Callable[[str], str]
) -> tuple[Task, ...]:
    """``n_val`` tasks from ``rng`` (:func:`validation_rng`) whose keys are in the train part of the key space
    (``split_of(space_key(key)) == "train"``) and not in ``taken`` (this run's train and test keys); distinct,
    prefix-stable, ids ``{name}-{seed}-validation-{index:05d}``."""
    if n_val < 0:
        raise ValueError("n_val must be >= 0")
    out: list[Task] = []
    seen = set(taken)
    for _ in range(100 * n_val + 1000):
        if len(out) >= n_val:
            return tuple(out)
        key, make = draw(rng)
        if key in seen or split_of(space_key(key)) != "train":
            continue
        seen.add(key)
        try:
            prompt, answer = make()
        except InfeasibleDraw:
            continue
        out.append(Task(f"{name}-{seed}-validation-{len(out):05d}", prompt, answer, "validation"))
    raise TooFewProblems(
        f"{name}: could not draw {n_val} validation problems distinct from the train and test ones with these "
        "settings; lower env.n_val or env.n_train"
    )


def draw_splits(
    name: str, seed: int, n_train: int, n_test: int, draw: Draw
) -> tuple[tuple[Task, ...], tuple[Task, ...]]:
    """``(train, test)`` with distinct canonical keys; ids are ``{name}-{seed}-{split}-{index:05d}``."""
    train, test, _ = _draw_train_test(name, seed, n_train, n_test, draw)
    return train, test


def draw_three(name: str, seed: int, n_train: int, n_val: int, n_test: int, draw: Draw) -> Splits:
    """:func:`draw_splits`' train and test (unchanged by ``n_val``), and :func:`draw_validation`'s ``n_val``."""
    train, test, keys = _draw_train_test(name, seed, n_train, n_test, draw)
    rng = validation_rng(name, seed)
    return Splits(train, draw_validation(name, seed, n_val, rng, draw, keys, lambda k: f"{name}:{k}"), test)


def _draw_train_test(
    name: str, seed: int, n_train: int, n_test: int, draw: Draw
) -> tuple[tuple[Task, ...], tuple[Task, ...], set[str]]:
    """``(train, test, their canonical keys)``."""
    if n_train < 0 or n_test < 0:
        raise ValueError("n_train and n_test must be >= 0")
    rng = random.Random(seed)
    out: dict[Literal["train", "test"], list[Task]] = {"train": [], "test": []}
    want = {"train": n_train, "test": n_test}
    seen: set[str] = set()
    for _ in range(100 * (n_train + n_test) + 1000):
        if all(len(out[s]) >= want[s] for s in out):
            return tuple(out["train"]), tuple(out["test"]), seen
        key, make = draw(rng)
        split = split_of(f"{name}:{key}")
        if key in seen or len(out[split]) >= want[split]:
            continue
        seen.add(key)
        try:
            prompt, answer = make()
        except InfeasibleDraw:  # a draw that was always skipped: the tasks before and after it are unchanged
            continue
        out[split].append(Task(f"{name}-{seed}-{split}-{len(out[split]):05d}", prompt, answer, split))
    raise TooFewProblems(
        f"{name}: could not draw {n_train} train + {n_test} test distinct problems with these settings; lower "
        "env.n_train / env.n_test or make the problems harder"
    )


def carved(key: str) -> bool:
    """Whether the problem with canonical ``key`` is in the share (~10 %) carved from a train split as validation
    where validation cannot be drawn apart from train (a second hash of the key, independent of :func:`split_of`)."""
    return int.from_bytes(hashlib.sha256(f"validation:{key}".encode()).digest()[:8], "big") % 100 < _CARVED_BUCKETS


def carve_validation(train: Sequence[Task]) -> tuple[tuple[Task, ...], tuple[Task, ...]]:
    """``(the rest of train, validation)``: the train tasks whose prompt is :func:`carved` become validation tasks
    (``split="validation"``), in their order. A function of each prompt alone (the canonical key of a task file and
    of a user's factory), so the carve is the same in every run."""
    rest = tuple(t for t in train if not carved(t.prompt))
    return rest, tuple(dataclasses.replace(t, split="validation") for t in train if carved(t.prompt))


def split_file(tasks: Sequence[Task], n_train: int, n_val: int, n_test: int) -> Splits:
    """A task file's splits: the first ``n_train`` / ``n_val`` / ``n_test`` of each; a file without validation
    rows has its validation carved from its train rows (:func:`carve_validation`)."""
    if n_train < 0 or n_val < 0 or n_test < 0:
        raise ValueError("n_train, n_val and n_test must be >= 0")
    train = tuple(t for t in tasks if t.split == "train")
    validation = tuple(t for t in tasks if t.split == "validation")
    if not validation:
        train, validation = carve_validation(train)
    return Splits(train[:n_train], validation[:n_val], tuple(t for t in tasks if t.split == "test")[:n_test])


def tasks_from(
    name: str, seed: int, n_train: int, n_test: int, draw: Draw, tasks_file: str | Path | None, n_val: int = 0
) -> Splits:
    """A factory's splits: the first ``n_train`` / ``n_val`` / ``n_test`` tasks of ``tasks_file`` if given
    (:func:`split_file`), else generated (:func:`draw_three`)."""
    if tasks_file is None:
        return draw_three(name, seed, n_train, n_val, n_test, draw)
    return split_file(read_tasks_jsonl(tasks_file), n_train, n_val, n_test)
