"""SQL: questions about a generated shop database, answered with a read-only ``query`` tool over SQLite.

    factory = SqlFactory(seed=0)
    env = factory.make(factory.tasks("train")[0])

The database (customers, products, orders) comes from a fixed seeded generator, so every factory, every seed and the
scripted expert see the same data; ``seed`` only chooses which questions are drawn. Questions are templates whose
answers are computed by the template's reference SQL (one integer), and the expert's demo is that SQL. A question's
canonical key is its template and parameters, so the split of a question never depends on the seed; validation
(``n_val``, drawn after train and test, which it leaves unchanged) comes from
:func:`harmonyrl.envs.taskfile.draw_three`.

Every query runs on a *fresh in-memory copy* of the database, with three independent guards, so nothing the
model writes can change what the next call (or episode) sees:

* the statement must start with ``SELECT`` or ``WITH`` (comments aside) — the friendly refusal;
* an SQLite authorizer allows only reading (``DROP``, ``INSERT``, ``ATTACH``, ``PRAGMA``, ``VACUUM INTO`` are
  denied when the statement is prepared), plus ``PRAGMA query_only``;
* a progress handler stops any query past ``query_timeout_s`` (a runaway recursive CTE), at most
  ``max_rows`` rows are returned, and strings are capped at ``SQLITE_LIMIT_LENGTH``.

All of these are the model's own doing and come back as ``{"error": ...}`` observations, never failures.

An answer is graded right only if it came from the database (:func:`answer_from_query`): one of the episode's
queries read a table and returned exactly that value as its only cell. Without this, about one held-out answer in
five is a per-question constant (a count of 0-5, a month), and RL learned to answer without querying
(docs/envs.md). A query that selects a constant while reading a table (``SELECT 4 FROM orders``) still passes.
"""

from __future__ import annotations

import json
import random
import re
import sqlite3
import string
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from harmonyrl.envs.reward import OUTCOME_ONLY, AnswerEnv, RewardWeights, exact_match
from harmonyrl.envs.taskfile import tasks_from
from harmonyrl.envs.tools import Tool, Toolbox, error_text, observation
from harmonyrl.errors import NotDemonstrable
from harmonyrl.tasks.guesses import VERBOSE_TEMPLATES, guess_answer
from harmonyrl.types import Message, Split, Task

DB_SEED = 20240611
CITIES = ("Lyon", "Porto", "Leeds", "Graz", "Bergen", "Turin", "Ghent", "Krakow")
CATEGORIES = ("furniture", "kitchen", "garden", "toys", "books", "sports")
YEARS = (2021, 2022, 2023, 2024)
_FIRST = ("Ada", "Ben", "Chloe", "Dev", "Elif", "Farid", "Greta", "Hugo", "Iris", "Jonas", "Kira", "Leo")
_LAST = ("Moreau", "Silva", "Novak", "Berg", "Rossi", "Peeters", "Kowalski", "Hughes", "Larsen", "Weber")
_NOUNS = ("Desk", "Pan", "Rake", "Kite", "Atlas", "Ball", "Lamp", "Kettle", "Hose", "Puzzle", "Novel", "Racket")
_ADJECTIVES = ("Oak", "Steel", "Green", "Red", "Tiny", "Grand", "Swift", "Blue")
TABLES = {
    "customers": "id, name, city, joined",  # joined: a year
    "products": "id, name, category, price_cents",
    "orders": "id, customer_id, product_id, quantity, year, month",  # month: 1-12
}
SCHEMA = ", ".join(f"{table}({columns})" for table, columns in TABLES.items())
INSTRUCTIONS = (
    f"Answer the question about the shop database. Tables: {SCHEMA}. Use the query tool to run one SQLite "
    "SELECT. Then answer on the final channel with only the number."
)
_ALLOWED = frozenset({sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE})
_LEADING = re.compile(r"(\s+|--[^\n]*(\n|$)|/\*.*?(\*/|$))*", re.DOTALL)  # whitespace and comments
_READ_ONLY = "only read-only SELECT queries are allowed"


@dataclass(frozen=True)
class Shop:
    """The generated database (kept as a master connection to copy from) and its values questions draw on."""

    master: sqlite3.Connection
    lock: threading.Lock
    customers: tuple[str, ...]
    products: tuple[str, ...]

    def copy(self) -> sqlite3.Connection:
        """A private in-memory copy (~0.1 ms): whatever a query does, it does to nobody else."""
        conn = sqlite3.connect(":memory:", check_same_thread=False)
        with self.lock:  # one master connection, used from the tool threads
            self.master.backup(conn)
        return conn


@cache
def shop() -> Shop:
    """The one shop database, built on first use from :data:`DB_SEED` (identical on every machine)."""
    r = random.Random(DB_SEED)
    db = sqlite3.connect(":memory:", check_same_thread=False)
    for table, columns in TABLES.items():
        db.execute(f"CREATE TABLE {table}({columns})")  # untyped columns: every value inserted is an int or text
    customers = r.sample([f"{f} {la}" for f in _FIRST for la in _LAST], 60)
    products = r.sample([f"{a} {n}" for a in _ADJECTIVES for n in _NOUNS], 30)
    db.executemany(
        "INSERT INTO customers VALUES (?, ?, ?, ?)",
        [(i + 1, name, r.choice(CITIES), r.randint(2019, 2024)) for i, name in enumerate(customers)],
    )
    db.executemany(
        "INSERT INTO products VALUES (?, ?, ?, ?)",
        [(i + 1, name, CATEGORIES[i % 6], 50 * r.randint(4, 600)) for i, name in enumerate(products)],
    )
    rows = [(i + 1, r.randint(1, 60), r.randint(1, 30), r.choice((1, 1, 1, 2, 2, 3, 4, 5, 8)), r.choice(YEARS),
             r.randint(1, 12)) for i in range(800)]  # fmt: skip
    db.executemany("INSERT INTO orders VALUES (?, ?, ?, ?, ?, ?)", rows)
    db.commit()
    return Shop(db, threading.Lock(), tuple(customers), tuple(products))


# ---- the query tool ----------------------------------------------------------------------------------


def _authorize(action: int, *_: str | None) -> int:
    return sqlite3.SQLITE_OK if action in _ALLOWED else sqlite3.SQLITE_DENY


def _cell(value: object) -> object:
    return f"<{len(value)} bytes>" if isinstance(value, bytes) else value


def run_query(db: Shop, sql: str, timeout_s: float = 1.0, max_rows: int = 50) -> str:
    """Run one read-only statement on a copy of ``db``; rows (at most ``max_rows``) or an error, as JSON."""
    leading = _LEADING.match(sql)
    head = sql[leading.end() if leading else 0 :].split(None, 1)
    if not head or head[0].upper().rstrip("(") not in ("SELECT", "WITH"):
        return error_text(f"{_READ_ONLY}; got {head[0][:20]!r}" if head else "empty query")
    try:  # a lone surrogate (JSON's "\ud800") is a str SQLite cannot take: the model's error, not a tool crash
        sql.encode("utf-8")
    except UnicodeEncodeError as e:
        return error_text(f"the query is not valid text: {e.reason} at character {e.start}")
    conn = db.copy()
    deadline, stopped = time.monotonic() + timeout_s, [False]

    def progress() -> int:
        stopped[0] = time.monotonic() > deadline
        return int(stopped[0])

    try:
        conn.execute("PRAGMA query_only = ON")
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 100_000)
        conn.set_authorizer(_authorize)
        conn.set_progress_handler(progress, 1000)
        cursor = conn.execute(sql)
        rows = cursor.fetchmany(max_rows + 1)
        columns = [d[0] for d in cursor.description or ()]
    except sqlite3.Error as e:
        if stopped[0]:
            return error_text(f"query stopped after {timeout_s:g} s (time limit)")
        if "not authorized" in str(e) or "authorization denied" in str(e):
            return error_text(f"{_READ_ONLY} (the statement tried to change or attach a database)")
        return error_text(f"{type(e).__name__}: {e}")
    finally:
        conn.close()
    body: dict[str, object] = {"columns": columns, "rows": [[_cell(v) for v in row] for row in rows[:max_rows]]}
    if len(rows) > max_rows:
        body["truncated"] = f"only the first {max_rows} rows are shown"
    return json.dumps(body, ensure_ascii=False)


def make_query_tool(db: Shop, timeout_s: float = 1.0, max_rows: int = 50) -> Tool:
    def query(sql: str) -> str:
        """Run one read-only SQLite SELECT on the shop database and return the columns and rows as JSON.

        Args:
            sql: One SELECT statement, e.g. "SELECT COUNT(*) FROM orders WHERE year = 2023".
        """
        return run_query(db, sql, timeout_s, max_rows)

    # The tool's own limit only fires if SQLite ignores its progress handler: that would be an env fault.
    return Tool.from_function(query, timeout_s=timeout_s + 4.0)


def reads_a_table(db: Shop, sql: str) -> bool:
    """Whether ``sql`` (a statement the query tool accepted) reads one of the shop's tables, as SQLite's
    authorizer reports it when the statement is prepared (``EXPLAIN``: nothing runs)."""
    read: list[str] = []

    def record(action: int, table: str | None, *_: str | None) -> int:
        if action == sqlite3.SQLITE_READ and table in TABLES:
            read.append(table)
        return _authorize(action)

    conn = db.copy()
    try:
        conn.set_authorizer(record)
        conn.execute(f"EXPLAIN {sql}")
    except sqlite3.Error:
        return False
    finally:
        conn.close()
    return bool(read)


def _only_cell(observation: str) -> object:
    try:
        rows = json.loads(observation).get("rows")
    except (ValueError, AttributeError):
        return None
    return rows[0][0] if isinstance(rows, list) and len(rows) == 1 and len(rows[0]) == 1 else None


def answer_from_query(answer: str, results: Sequence[tuple[Message, Message]]) -> bool:
    """Whether a ``query`` call of the episode read a table and returned ``answer`` as its only cell (the
    :data:`~harmonyrl.envs.reward.Evidence` check of this env: the answer must be derived from the database)."""
    for call, obs in results:
        if call.recipient != "functions.query":
            continue
        cell = _only_cell(obs.content)
        if isinstance(cell, float) and cell.is_integer():
            cell = int(cell)
        if cell is None or isinstance(cell, bool) or not exact_match(answer, str(cell)):
            continue
        try:
            sql = json.loads(call.content)["sql"]
        except (ValueError, KeyError, TypeError):
            continue
        if isinstance(sql, str) and reads_a_table(shop(), sql):
            return True
    return False


# ---- questions ---------------------------------------------------------------------------------------

_JOIN_P = "FROM orders o JOIN products p ON p.id = o.product_id"
_JOIN_C = "FROM orders o JOIN customers c ON c.id = o.customer_id"
_JOIN_CP = f"{_JOIN_C} JOIN products p ON p.id = o.product_id"
QUESTIONS: dict[str, tuple[str, str]] = {
    # name: (English, reference SQL); {city} {category} {product} {customer} are text, the rest integers
    "city_orders": ("How many orders were placed by customers from {city}?",
                    f"SELECT COUNT(*) AS answer {_JOIN_C} WHERE c.city = '{{city}}'"),
    "city_year_orders": ("How many orders did customers from {city} place in {year}?",
                         f"SELECT COUNT(*) AS answer {_JOIN_C} WHERE c.city = '{{city}}' AND o.year = {{year}}"),
    "product_units": ("How many units of {product} were sold in total?",
                      f"SELECT COALESCE(SUM(o.quantity), 0) AS answer {_JOIN_P} WHERE p.name = '{{product}}'"),
    "category_revenue": ("What was the total revenue, in cents, from {category} products in {year}?",
                         "SELECT COALESCE(SUM(o.quantity * p.price_cents), 0) AS answer "
                         f"{_JOIN_P} WHERE p.category = '{{category}}' AND o.year = {{year}}"),
    "city_category_buyers": ("How many different customers from {city} bought at least one {category} product?",
                             f"SELECT COUNT(DISTINCT c.id) AS answer {_JOIN_CP} "
                             "WHERE c.city = '{city}' AND p.category = '{category}'"),
    "customer_spend": ("How much did {customer} spend in {year}, in cents?",
                       f"SELECT COALESCE(SUM(o.quantity * p.price_cents), 0) AS answer {_JOIN_CP} "
                       "WHERE c.name = '{customer}' AND o.year = {year}"),
    "customer_units": ("How many units did {customer} order in total?",
                       f"SELECT COALESCE(SUM(o.quantity), 0) AS answer {_JOIN_C} WHERE c.name = '{{customer}}'"),
    "big_orders": ("How many orders of {product} had a quantity of at least {quantity}?",
                   f"SELECT COUNT(*) AS answer {_JOIN_P} WHERE p.name = '{{product}}' AND o.quantity >= {{quantity}}"),
    "cheap_products": ("How many {category} products cost less than {price} cents?",
                       "SELECT COUNT(*) AS answer FROM products "
                       "WHERE category = '{category}' AND price_cents < {price}"),
    "costly_orders": ("How many orders in {year} were worth more than {price} cents?",
                      f"SELECT COUNT(*) AS answer {_JOIN_P} WHERE o.year = {{year}} "
                      "AND o.quantity * p.price_cents > {price}"),
    "city_joined": ("How many customers from {city} joined in {year} or later?",
                    "SELECT COUNT(*) AS answer FROM customers WHERE city = '{city}' AND joined >= {year}"),
    "top_customer": ("Which customer spent the most in {year}? Answer with their id (the lowest id if tied).",
                     f"SELECT o.customer_id AS answer {_JOIN_P} WHERE o.year = {{year}} GROUP BY o.customer_id "
                     "ORDER BY SUM(o.quantity * p.price_cents) DESC, o.customer_id LIMIT 1"),
    "busiest_month": ("In which month of {year} were the most units sold? Answer with the month number "
                      "(the earliest if tied).", "SELECT month AS answer FROM orders WHERE year = {year} "
                      "GROUP BY month ORDER BY SUM(quantity) DESC, month LIMIT 1"),
}  # fmt: skip
_TEXT_FIELDS = frozenset({"city", "category", "product", "customer"})


def _draw(r: random.Random) -> tuple[str, Callable[[], tuple[str, str]]]:
    db = shop()
    name = r.choice(sorted(QUESTIONS))
    values = {  # every field is drawn every time: the same randomness per draw, whatever the question
        "city": r.choice(CITIES), "category": r.choice(CATEGORIES), "product": r.choice(db.products),
        "customer": r.choice(db.customers), "year": r.choice(YEARS), "quantity": r.randint(2, 6),
        "price": 250 * r.randint(2, 120),
    }  # fmt: skip
    prompt, sql = QUESTIONS[name]
    used = {f for _, f, _, _ in string.Formatter().parse(prompt) if f}
    fields = {k: v for k, v in values.items() if k in used}

    def make() -> tuple[str, str]:
        return prompt.format(**fields), answer_of(sql.format(**fields))

    return f"{name}:{sorted(fields.items())}", make


def answer_of(sql: str) -> str:
    """The reference answer: the single value the reference SQL selects, as decimal text."""
    db = shop()
    with db.lock:
        (value,) = db.master.execute(sql).fetchone()
    return str(value)


@cache
def _patterns() -> tuple[tuple[re.Pattern[str], str], ...]:
    out = []
    for name, (prompt, _) in QUESTIONS.items():
        parts = []
        for literal, field, _, _ in string.Formatter().parse(prompt):
            parts.append(re.escape(literal))
            if field:
                parts.append(rf"(?P<{field}>[A-Za-z][A-Za-z ]*?)" if field in _TEXT_FIELDS else rf"(?P<{field}>\d+)")
        out.append((re.compile("".join(parts)), name))
    return tuple(out)


def parse_question(task: Task) -> tuple[str, dict[str, str]]:
    """(question name in :data:`QUESTIONS`, its parameters) of a generated question, recovered from its wording."""
    for pattern, name in _patterns():
        if m := pattern.fullmatch(task.prompt):
            return name, m.groupdict()
    raise NotDemonstrable(f"not a generated sql question (no template matches): {task.prompt[:80]!r}")


def reference_sql(task: Task) -> str:
    """The SQL whose single value is the answer of a generated question."""
    name, fields = parse_question(task)
    return QUESTIONS[name][1].format(**fields)


class SqlFactory:
    """Questions over the shop database; one ``query`` tool (a fresh database copy per call) for every episode."""

    name = "sql"

    def __init__(
        self,
        seed: int = 0,
        n_train: int = 1000,
        n_test: int = 50,
        query_timeout_s: float = 1.0,
        max_rows: int = 50,
        weights: RewardWeights = OUTCOME_ONLY,
        tasks_file: str | Path | None = None,
        n_val: int = 0,
    ) -> None:
        if query_timeout_s <= 0 or max_rows < 1:
            raise ValueError("query_timeout_s must be > 0 and max_rows >= 1")
        self.seed = seed
        self.weights = weights
        self.db = shop()
        self._splits = tasks_from(self.name, seed, n_train, n_test, _draw, tasks_file, n_val)
        self._toolbox = Toolbox([make_query_tool(self.db, query_timeout_s, max_rows)])

    def tasks(self, split: Split) -> Sequence[Task]:
        return self._splits.of(split)

    def make(self, task: Task) -> AnswerEnv:
        return AnswerEnv(task, self._toolbox, INSTRUCTIONS, self.weights, evidence=answer_from_query)


def expert_demo(task: Task, rng: random.Random, p_tool: float = 0.8, p_verbose: float = 0.0) -> list[Message]:
    """A demonstration: the reference SQL as a ``query`` call, its real result, then the bare answer.

    Imperfections as in the calculator's expert: with probability ``1 - p_tool`` a plausible wrong guess
    without querying; with probability ``p_verbose`` the right value wrapped in a sentence (scored 0).
    """
    sql = reference_sql(task)  # first: a task no template matches fails whichever branch the draw picks
    if rng.random() >= p_tool:
        return [Message(role="assistant", channel="final", content=guess_answer(int(task.answer), rng))]
    result = run_query(shop(), sql)
    value = str(json.loads(result)["rows"][0][0])
    call = Message(
        role="assistant",
        channel="commentary",
        recipient="functions.query",
        content_type="json",
        content=json.dumps({"sql": sql}),
    )
    verbose = p_verbose > 0 and rng.random() < p_verbose  # p_verbose 0 draws nothing: demo streams stay put
    answer = rng.choice(VERBOSE_TEMPLATES).format(value) if verbose else value
    return [call, observation("query", result), Message(role="assistant", channel="final", content=answer)]
