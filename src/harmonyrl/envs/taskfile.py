"""Where a factory's tasks come from: a JSONL task file, or prefix-stable generation with hash-disjoint splits.

Task file schema — one JSON object per line (blank lines are skipped)::

    {"id": "shop-0001", "prompt": "How many orders ...?", "answer": "17", "split": "train"}

* ``id``: non-empty string, unique in the file;
* ``prompt``: non-empty string, the user message;
* ``answer``: string (an integer is accepted and kept as its decimal text), what the env grades against;
* ``split``: ``"train"`` or ``"test"``; a prompt may not appear in both (a leaked held-out problem).

Other keys are errors, so a misspelt ``"anwser"`` fails loudly instead of loading tasks without answers.
Every error is one line starting ``path:line:``, the form editors and terminals jump to.

Generation (:func:`draw_splits`) assigns a problem to a split by a hash of its *canonical key* (what the
problem is, not how it is worded), independent of the seed, so no seed and no rewording puts a test problem in
train. Every draw consumes the same randomness whether it is kept or not, so the first k tasks of a split do
not depend on ``n_train`` / ``n_test`` (prefix stability), as in :mod:`harmonyrl.tasks.calculator`.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from harmonyrl.types import Task

Split = Literal["train", "test"]
_KEYS = frozenset({"id", "prompt", "answer", "split"})


class TaskFileError(ValueError):
    """A malformed task file; the message is ``path:line: what is wrong``."""


_TEST_BUCKETS = 5  # out of 100: ~5% of a problem space is test-only, for every seed


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
    if row["split"] not in ("train", "test"):
        raise TaskFileError(f'{where}: \'split\' must be "train" or "test", got {row["split"]!r}'[:300])
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
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    return [t for t in read_tasks_jsonl(path) if t.split == split]


class TooFewProblems(ValueError):
    """An env asked for more distinct generated problems than its settings allow (e.g. a 3x3 maze)."""


class InfeasibleDraw(ValueError):
    """Raised by a draw's ``make`` when the generator cannot pose the problem it drew (e.g. no reference answer
    meets the drawn constraints): the problem is skipped and the next one drawn."""


Draw = Callable[[random.Random], tuple[str, Callable[[], tuple[str, str]]]]
"""One problem from the generator: ``(canonical key, make)``, where ``make()`` gives ``(prompt, answer)``.
All randomness must be drawn before returning (``make`` only renders / computes): that is what keeps
generation prefix-stable when ``make`` is only called for kept problems."""


def draw_splits(
    name: str, seed: int, n_train: int, n_test: int, draw: Draw
) -> tuple[tuple[Task, ...], tuple[Task, ...]]:
    """``(train, test)`` with distinct canonical keys; ids are ``{name}-{seed}-{split}-{index:05d}``."""
    if n_train < 0 or n_test < 0:
        raise ValueError("n_train and n_test must be >= 0")
    rng = random.Random(seed)
    out: dict[Split, list[Task]] = {"train": [], "test": []}
    want = {"train": n_train, "test": n_test}
    seen: set[str] = set()
    for _ in range(100 * (n_train + n_test) + 1000):
        if all(len(out[s]) >= want[s] for s in out):
            return tuple(out["train"]), tuple(out["test"])
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


def tasks_from(
    name: str, seed: int, n_train: int, n_test: int, draw: Draw, tasks_file: str | Path | None
) -> tuple[tuple[Task, ...], tuple[Task, ...]]:
    """A factory's splits: the first ``n_train`` / ``n_test`` tasks of ``tasks_file`` if given, else generated."""
    if tasks_file is None:
        return draw_splits(name, seed, n_train, n_test, draw)
    if n_train < 0 or n_test < 0:
        raise ValueError("n_train and n_test must be >= 0")
    tasks = read_tasks_jsonl(tasks_file)
    train = tuple(t for t in tasks if t.split == "train")[:n_train]
    return train, tuple(t for t in tasks if t.split == "test")[:n_test]
