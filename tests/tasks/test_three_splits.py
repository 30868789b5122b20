"""Every built-in env has train, validation and test splits, disjoint by the env's own canonical key; adding the
validation split left the generated envs' train and test splits exactly as they were; a user's factory (and a task
file) without a validation split gets one carved from its train split; runs evaluate on ``eval.split``."""

from __future__ import annotations

import hashlib
import itertools
import random
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest

from harmonyrl.config import load_config
from harmonyrl.envs.checker import check_env, missing_validation
from harmonyrl.envs.taskfile import Draw, carved
from harmonyrl.run.setup import held_out_tasks
from harmonyrl.tasks import browse, calculator, instruct, maze, retool, sql
from harmonyrl.tasks.custom import CarvedValidation, HashOrdered, with_validation
from harmonyrl.tasks.factory import make_factory
from harmonyrl.tasks.humaneval import held_out_ids, split_tasks, validation_ids
from harmonyrl.types import Split, Task

SPLITS: tuple[Split, ...] = ("train", "validation", "test")


def fingerprint(tasks: Iterable[Task]) -> str:
    h = hashlib.sha256()
    for t in tasks:
        h.update(f"{t.id}\x00{t.prompt}\x00{t.answer}\x00{t.split}\n".encode())
    return h.hexdigest()[:16]


# (train, test) fingerprints of seed 0, computed with `fingerprint` above on commit 9c82b70 (before the validation
# split existed) from `make_factory(<the env config below>, 0)`: they pin that validation was drawn without
# moving a single train or test task (ids, prompts, answers, split labels, order). None: that split is allowed to
# have changed (browse with worlds carves its validation questions out of train; humaneval out of its fixed 124).
BEFORE: dict[str, tuple[list[str], str | None, str]] = {
    "calculator": (["env.name=calculator"], "9cc345b9dae8c88e", "9a5aaac4e5cc7874"),
    "calculator_levels": (
        ["env.name=calculator", "env.levels=[0,3]", "env.test_levels=[2,4]"],
        "327e22472fa5c6c4",
        "ddc36d3b3e37c5bd",
    ),
    "calculator_operands": (
        ["env.name=calculator", "env.operand_values=8", "env.n_train=300", "env.n_test=40"],
        "8d9989ff8acd77eb",
        "08b9a0251b22b693",
    ),
    "retool": (["env.name=retool"], "ba92d924a431a135", "fba633f21382b2d0"),
    "sql": (["env.name=sql"], "801221cd45eff6e4", "74746ca8e58c3cfc"),
    "instruct": (["env.name=instruct"], "6fcbcba435448f1c", "155cc209e74b1c01"),
    "maze": (["env.name=maze"], "32468a6e3f351465", "8c078b7701552d24"),
    "browse": (["env.name=browse"], "dd0aec35a5571b14", "8e64e7951915de8c"),
    "browse_worlds": (["env.name=browse", "env.worlds=5", "env.n_test=60"], None, "84d0a4e67549c25a"),
    "relay": (["env.name=relay"], "9cc345b9dae8c88e", "9a5aaac4e5cc7874"),
    "humaneval": (["env.name=humaneval"], None, "a795029e0dc5f6bd"),
}


@pytest.mark.parametrize("name", sorted(BEFORE))
def test_train_and_test_are_exactly_as_before_validation_existed(name: str) -> None:
    overrides, train, test = BEFORE[name]
    env = load_config(None, overrides).env
    factory = env.build_factory(0) if name != "humaneval" else None  # humaneval's factory needs the sandbox
    splits = {s: factory.tasks(s) for s in SPLITS} if factory else dict(zip(SPLITS, split_tasks(), strict=True))
    assert fingerprint(splits["test"]) == test
    if train is not None:
        assert fingerprint(splits["train"]) == train
    n_val = env.n_test if getattr(env, "n_val", None) is None else env.n_val  # type: ignore[attr-defined]
    assert len(splits["validation"]) == n_val > 0 and {t.split for t in splits["validation"]} == {"validation"}


# ---- disjoint by the canonical key -------------------------------------------------------------------------


def _recording(draw: Draw, keys: dict[str, set[str]]) -> Draw:
    """``draw``, noting the canonical key of every problem it poses, by the prompt it posed it with."""

    def wrapped(rng: random.Random) -> tuple[str, Callable[[], tuple[str, str]]]:
        key, make = draw(rng)

        def posed() -> tuple[str, str]:
            prompt, answer = make()
            keys.setdefault(prompt, set()).add(key)
            return prompt, answer

        return key, posed

    return wrapped


def _assert_disjoint(splits: dict[Split, Sequence[Task]], key_of: Callable[[Task], str]) -> None:
    for split, tasks in splits.items():
        assert tasks and all(t.split == split for t in tasks), split
    for a, b in itertools.combinations(SPLITS, 2):
        shared = {key_of(t) for t in splits[a]} & {key_of(t) for t in splits[b]}
        assert not shared, (a, b, sorted(shared)[:3])
    ids = [t.id for tasks in splits.values() for t in tasks]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize(
    ("module", "overrides"),
    [
        (retool, ["env.name=retool", "env.n_train=400", "env.n_test=40"]),
        (sql, ["env.name=sql", "env.n_train=400", "env.n_test=40"]),
        (instruct, ["env.name=instruct", "env.n_train=400", "env.n_test=40"]),
        (maze, ["env.name=maze", "env.size=3", "env.n_train=400", "env.n_test=25"]),  # 545 train-space mazes
        (browse, ["env.name=browse", "env.n_train=700", "env.n_test=39", "env.n_val=90"]),  # 801 train questions
    ],
    ids=["retool", "sql", "instruct", "maze", "browse"],
)
def test_generated_splits_share_no_canonical_key(module: Any, overrides: list[str], monkeypatch: Any) -> None:
    keys: dict[str, set[str]] = {}
    if module is maze:
        sized = maze._draw
        monkeypatch.setattr(maze, "_draw", lambda size: _recording(sized(size), keys))
    else:
        monkeypatch.setattr(module, "_draw", _recording(module._draw, keys))
    factory = make_factory(load_config(None, overrides).env, seed=3)
    splits = {s: factory.tasks(s) for s in SPLITS}
    assert all(len(keys[t.prompt]) == 1 for tasks in splits.values() for t in tasks)  # every task was recorded
    _assert_disjoint(splits, lambda t: next(iter(keys[t.prompt])))
    if module is browse:  # validation questions are training questions (split_of) that this run does not train on
        assert all(browse.split_of(f"browse:{k}") == "train" for t in splits["validation"] for k in keys[t.prompt])


def test_calculator_and_relay_splits_share_no_canonical_key(monkeypatch: pytest.MonkeyPatch) -> None:
    keys: dict[str, str] = {}  # expression -> canonical key (commutative operands sorted)

    def noted(shape: calculator.Shape) -> calculator.Shape:
        def posed(r: random.Random) -> calculator.Problem:
            problem = shape(r)
            keys[problem.expression] = problem.key
            return problem

        return posed

    monkeypatch.setattr(calculator, "SHAPES", tuple(noted(s) for s in calculator.SHAPES))
    cfg = ["env.n_train=3000", "env.n_test=200"]
    solo = make_factory(load_config(None, ["env.name=calculator", *cfg]).env, seed=1)
    splits = {s: solo.tasks(s) for s in SPLITS}
    _assert_disjoint(splits, lambda t: keys[calculator.expression_of(t)])
    assert all(calculator.split_of(keys[calculator.expression_of(t)]) == "train" for t in splits["validation"])
    team = make_factory(load_config(None, ["env.name=relay", *cfg]).env, seed=1)
    assert all(team.tasks(s) == splits[s] for s in SPLITS)  # the team plays the very same three splits


def test_levelled_validation_is_posed_like_the_held_out_problems() -> None:
    cfg = load_config(None, ["env.levels=[0,2]", "env.test_levels=[3,4]", "env.n_train=200", "env.n_test=30"]).env
    factory = make_factory(cfg, seed=0)
    validation = factory.tasks("validation")
    assert len(validation) == 30 and {factory.difficulty(t) for t in validation} <= {3, 4}  # type: ignore[attr-defined]
    seen = {calculator.expression_of(t) for s in ("train", "test") for t in factory.tasks(s)}
    assert not seen & {calculator.expression_of(t) for t in validation}


def test_browse_worlds_carve_their_validation_questions_out_of_train() -> None:
    factory = make_factory(load_config(None, ["env.name=browse", "env.worlds=20", "env.n_train=2000"]).env, seed=0)
    splits = {s: factory.tasks(s) for s in SPLITS}
    question = browse.parse_question
    _assert_disjoint(splits, lambda t: ":".join(question(t)))  # by question, whatever the web
    assert all(carved(f"browse:{':'.join(question(t))}") for t in splits["validation"])
    assert not any(carved(f"browse:{':'.join(question(t))}") for t in splits["train"])  # never trained on


def test_humaneval_validation_is_the_next_twenty_by_hash() -> None:
    train, validation, test = split_tasks()
    _assert_disjoint({"train": train, "validation": validation, "test": test}, lambda t: t.id)
    assert {t.id for t in validation} == validation_ids() and {t.id for t in test} == held_out_ids()
    assert (len(train), len(validation), len(test)) == (104, 20, 40)


# ---- a user's factory without a validation split -----------------------------------------------------------


class OldStyle:
    """A factory written before validation existed: every split but train is answered with its test tasks."""

    name = "old"

    def __init__(self, n: int = 200) -> None:
        tasks = [Task(f"old-{i}", f"What is {i} + {i}?", str(2 * i), "train") for i in range(n)]
        self.train = [t for t in tasks if i_of(t) % 10]
        self.test = [Task(t.id, t.prompt, t.answer, "test") for t in tasks if not i_of(t) % 10]

    def tasks(self, split: Split) -> Sequence[Task]:
        return self.train if split == "train" else self.test

    def make(self, task: Task) -> Any:
        raise NotImplementedError


def i_of(task: Task) -> int:
    return int(task.id.split("-")[1])


def test_a_factory_without_validation_gets_one_carved_from_train() -> None:
    old = OldStyle()
    assert missing_validation(old) == "tasks('validation') returned tasks whose Task.split is 'test'"
    given = with_validation(old)
    assert isinstance(given, CarvedValidation)
    splits = {s: given.tasks(s) for s in SPLITS}
    _assert_disjoint(splits, lambda t: t.prompt)  # the key check_env keeps train and test apart by
    assert {t.id for t in (*splits["train"], *splits["validation"])} == {t.id for t in old.train}  # a carve
    assert 10 <= len(splits["validation"]) <= 30 and splits["test"] == old.test  # ~10 % of 180; test untouched
    assert [t.id for t in with_validation(OldStyle()).tasks("validation")] == [t.id for t in splits["validation"]]
    assert list(HashOrdered(given).tasks("validation")) == sorted(splits["validation"], key=lambda t: hashlib.sha256(
        t.id.encode()).digest())  # fmt: skip


def test_a_factory_with_its_own_validation_is_used_as_it_is() -> None:
    class Own(OldStyle):
        def tasks(self, split: Split) -> Sequence[Task]:
            if split == "validation":
                return [Task("own-v", "What is 1000 + 1000?", "2000", "validation")]
            return super().tasks(split)

    own = Own()
    assert missing_validation(own) is None and with_validation(own) is own


def test_a_custom_env_run_carves_and_check_env_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from harmonyrl.envs.checker import acheck_report

    monkeypatch.chdir(tmp_path)
    (tmp_path / "units.py").write_text(_example().read_text())
    cfg = load_config(None, ["env.name=custom", "env.factory=units.py:UnitFactory", "env.kwargs.max_value=100"]).env
    factory = make_factory(cfg, seed=0)
    splits = {s: factory.tasks(s) for s in SPLITS}
    _assert_disjoint(splits, lambda t: t.prompt)
    assert check_env(factory, n_tasks=1) == []  # the run's factory (carved) passes the split checks
    import asyncio

    from harmonyrl.envs.loader import load_factory

    raw = load_factory("units.py:UnitFactory")(max_value=100)
    line = asyncio.run(acheck_report(raw, n_tasks=1)).summary()[-1]
    n = len(splits["validation"])
    assert line.startswith(f"validation: none of its own (tasks('validation') is empty); a run carves {n} of the ")


def _example() -> Path:
    return Path(__file__).parents[2] / "examples" / "unit_env.py"


# ---- what a run evaluates on --------------------------------------------------------------------------------


def test_the_held_out_evaluation_reads_eval_split() -> None:
    base = ["env.n_train=50", "env.n_test=20", "eval.n_tasks=5"]
    factory = make_factory(load_config(None, base).env, seed=0)
    assert held_out_tasks(load_config(None, base), factory) == factory.tasks("test")[:5]  # the default: test
    chosen = held_out_tasks(load_config(None, [*base, "eval.split=validation"]), factory)
    assert chosen == factory.tasks("validation")[:5] and {t.split for t in chosen} == {"validation"}
