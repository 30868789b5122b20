"""SQL env: generated questions and splits, the expert's reference SQL, and a query tool nothing can write through."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from harmonyrl.envs.checker import assert_env_ok
from harmonyrl.envs.reward import AnswerEnv
from harmonyrl.tasks.guesses import VERBOSE_TEMPLATES
from harmonyrl.tasks.sql import (
    QUESTIONS,
    SqlFactory,
    answer_from_query,
    answer_of,
    expert_demo,
    parse_question,
    reads_a_table,
    reference_sql,
    run_query,
    shop,
)
from harmonyrl.types import Message, StepResult, Task


def small() -> SqlFactory:
    return SqlFactory(seed=0, n_train=300, n_test=20)


FACTORY = small()
TRAIN, TEST = FACTORY.tasks("train"), FACTORY.tasks("test")


def test_check_env_passes() -> None:
    assert_env_ok(FACTORY, rebuild=small)


def test_questions_are_answered_by_their_reference_sql() -> None:
    for task in (*TRAIN, *TEST):
        assert answer_of(reference_sql(task)) == task.answer and int(task.answer) >= 0
    assert {parse_question(t)[0] for t in TRAIN} == set(QUESTIONS)
    assert len({t.answer for t in TRAIN}) > 100  # not a handful of guessable values
    with pytest.raises(ValueError, match="not a generated sql question"):
        reference_sql(Task("x", "How many tables are there?", "3", "train"))


def test_splits_deterministic_prefix_stable_and_disjoint() -> None:
    big = SqlFactory(seed=0, n_train=600, n_test=40)
    assert (big.tasks("train")[:300], big.tasks("test")[:20]) == (TRAIN, TEST)
    other = SqlFactory(seed=1, n_train=300, n_test=20)
    assert other.tasks("train") != TRAIN
    # a question's key is its template and parameters, i.e. its prompt: no prompt on both sides, for any seed
    train = {t.prompt for f in (big, other) for t in f.tasks("train")}
    assert not train & {t.prompt for f in (big, other) for t in f.tasks("test")}


def play(task: Task, actions: Sequence[Sequence[Message]], factory: SqlFactory = FACTORY) -> list[StepResult]:
    async def go() -> list[StepResult]:
        env: AnswerEnv = factory.make(task)
        await env.reset()
        return [await env.step(a) for a in actions]

    return asyncio.run(go())


def query(sql: str) -> list[Message]:
    args = json.dumps({"sql": sql})
    return [Message("assistant", args, channel="commentary", recipient="functions.query", content_type="json")]


def observe(sql: str, factory: SqlFactory = FACTORY) -> dict[str, object]:
    [result] = play(TRAIN[0], [query(sql)], factory)
    assert result.failure is None and not result.terminated and result.reward == 0.0
    return json.loads(result.observations[0].content)


def test_expert_demo_replays_to_full_reward() -> None:
    for i, task in enumerate([*TRAIN[:8], TEST[0]]):
        call, obs, answer = expert_demo(task, random.Random(i), p_tool=1.0)
        assert json.loads(call.content) == {"sql": reference_sql(task)} and answer.content == task.answer
        first, second = play(task, [[call], [answer]])
        assert first.observations == (obs,) and json.loads(obs.content)["rows"] == [[int(task.answer)]]
        assert (second.reward, second.terminated, second.info["correct"]) == (1.0, True, 1.0)


def test_wrong_and_verbose_answers_earn_nothing() -> None:
    task = TRAIN[0]
    [wrong] = play(task, [[Message("assistant", str(int(task.answer) + 1), channel="final")]])
    *_, verbose = expert_demo(task, random.Random(0), p_tool=1.0, p_verbose=1.0)
    assert verbose.content in {v.format(task.answer) for v in VERBOSE_TEMPLATES}
    [said] = play(task, [[verbose]])
    assert (wrong.reward, said.reward, said.terminated, said.info["format_error"]) == (0.0, 0.0, True, 0.0)


def final(text: str) -> list[Message]:
    return [Message("assistant", text, channel="final")]


def test_a_right_answer_counts_only_if_a_query_that_read_the_database_returned_it() -> None:
    task = TRAIN[0]  # "How many orders were placed by customers from Ghent?" -> 44
    a = task.answer
    assert a == "44" and reference_sql(task).startswith("SELECT COUNT(*) AS answer")
    graded = {
        "reference query": ([query(reference_sql(task))], 1.0),
        "another query with the same value": ([query(reference_sql(task).replace(" AS answer", " AS n"))], 1.0),
        "a REAL result": ([query(reference_sql(task).replace("COUNT(*)", "1.0 * COUNT(*)"))], 1.0),
        "a failed query first": ([query("SELECT nope FROM orders"), query(reference_sql(task))], 1.0),
        "no query (a guess)": ([], 0.0),
        "a constant query": ([query(f"SELECT {a}")], 0.0),  # reads no table
        "a constant from a CTE": ([query(f"WITH t AS (SELECT {a} AS x) SELECT x FROM t")], 0.0),
        "the value among other cells": ([query(f"SELECT {a} AS a, COUNT(*) AS b FROM orders")], 0.0),
        "one of many rows": ([query("SELECT DISTINCT customer_id FROM orders ORDER BY customer_id")], 0.0),
        "a query with another value": ([query(reference_sql(task).replace("COUNT(*)", "1 + COUNT(*)"))], 0.0),
        "an error": ([query("SELECT nope FROM orders")], 0.0),
    }
    got = {}
    for name, (calls, _) in graded.items():
        *_, last = play(task, [*calls, final(a)])
        assert last.terminated and last.info["ungrounded"] == 1.0 - last.info["correct"]  # every answer is exact
        got[name] = last.reward
    assert got == {name: reward for name, (_, reward) in graded.items()}
    # the residual hole, stated in the module docstring: a constant selected while reading a table passes
    *_, last = play(task, [query(f"SELECT {a} FROM orders LIMIT 1"), final(a)])
    assert last.reward == 1.0
    # a wrong answer is not "ungrounded": that metric counts right answers that no query produced
    *_, wrong = play(task, [final("45")])
    assert (wrong.reward, wrong.info["ungrounded"]) == (0.0, 0.0)


def test_answer_from_query_reads_only_query_results() -> None:
    call = query("SELECT COUNT(*) FROM products")[0]
    other = Message("assistant", json.dumps({"sql": "SELECT COUNT(*) FROM products"}), channel="commentary",
                    recipient="functions.remember", content_type="json")  # fmt: skip
    obs = Message("tool", '{"columns": ["n"], "rows": [[30]]}')
    assert answer_from_query("30", [(call, obs)]) and not answer_from_query("31", [(call, obs)])
    assert not answer_from_query("30", [(other, obs)])  # another tool's output is not a query result
    assert not answer_from_query("30", [(call, Message("tool", "not json"))])
    assert reads_a_table(shop(), "SELECT COUNT(*) FROM orders") and not reads_a_table(shop(), "SELECT 30")
    assert not reads_a_table(shop(), "SELECT * FROM nope")


def test_expert_mix_and_determinism() -> None:
    demos = [expert_demo(t, random.Random(i), p_tool=0.5) for i, t in enumerate(TRAIN)]
    assert abs(sum(len(d) == 3 for d in demos) / len(demos) - 0.5) < 0.1
    guesses = [d[0].content == t.answer for t, d in zip(TRAIN, demos, strict=True) if len(d) == 1]
    assert sum(guesses) / len(guesses) < 0.1  # a guess is wrong but plausible (rounding hits round numbers)
    assert expert_demo(TRAIN[5], random.Random(1)) == expert_demo(TRAIN[5], random.Random(1))


def snapshot() -> tuple[object, ...]:
    db = shop()
    with db.lock:
        master = tuple(db.master.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall())
        counts = tuple(db.master.execute(f"SELECT COUNT(*) FROM {t}").fetchone() for t in ("orders", "customers"))
    return master, counts


@pytest.mark.parametrize(
    "sql",
    [
        "DROP TABLE orders",
        "INSERT INTO orders VALUES (9999, 1, 1, 1, 2024, 1)",
        "delete from customers",
        "ATTACH DATABASE ':memory:' AS other",
        "PRAGMA writable_schema = ON",
        "VACUUM INTO '{tmp}/copy.db'",
        "/* a comment first */ UPDATE products SET price_cents = 0",
        "WITH x AS (SELECT 1) DELETE FROM orders",  # passes the keyword check: stopped by the authorizer
        "SELECT 1; DROP TABLE orders",
        "SELECT * FROM (SELECT 1) WHERE 1 = (SELECT 1 FROM pragma_writable_schema)",
        "",
    ],
)
def test_anything_but_select_is_refused_and_the_db_is_unchanged(sql: str, tmp_path: Path) -> None:
    before = snapshot()
    error = observe(sql.format(tmp=tmp_path))["error"]
    assert isinstance(error, str) and error
    expected = ("only read-only SELECT", "one statement", "empty query", "not authorized", "no such table")
    assert any(e in error for e in expected), error
    assert snapshot() == before and not (tmp_path / "copy.db").exists()
    assert observe("SELECT COUNT(*) FROM orders")["rows"] == [[800]]


def test_runaway_query_is_stopped_by_the_timeout() -> None:
    fast = SqlFactory(n_train=5, n_test=1, query_timeout_s=0.2)
    start = time.monotonic()
    body = observe("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT COUNT(*) FROM c", fast)
    assert body == {"error": "query stopped after 0.2 s (time limit)"}
    assert time.monotonic() - start < 2.0


def test_rows_are_capped_and_values_made_json() -> None:
    capped = observe("SELECT id, quantity FROM orders ORDER BY id", SqlFactory(n_train=5, n_test=1, max_rows=3))
    assert capped == {"columns": ["id", "quantity"], "rows": [[1, 5], [2, 3], [3, 2]],
                      "truncated": "only the first 3 rows are shown"}  # fmt: skip
    assert observe("SELECT x'0102' AS b, NULL AS n, 1.5 AS f") == {
        "columns": ["b", "n", "f"],
        "rows": [["<2 bytes>", None, 1.5]],
    }
    endless = observe("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c")
    assert len(endless["rows"]) == 50 and "truncated" in endless  # type: ignore[arg-type]
    assert "too big" in str(observe("SELECT replace(hex(zeroblob(60000)), '0', 'xx')")["error"])
    assert "no such table: nope" in str(observe("SELECT * FROM nope")["error"])


def test_run_query_directly() -> None:
    assert json.loads(run_query(shop(), "  -- count\n select count(*) as n from products")) == {
        "columns": ["n"],
        "rows": [[30]],
    }
