"""Browse: questions answered by searching and reading an offline web of generated pages.

    factory = BrowseFactory(seed=0)
    env = factory.make(factory.tasks("train")[0])    # tools: search(query), open(page_id, offset=0)

The pages and their BM25 index are :mod:`harmonyrl.tasks.web`. Questions are templates over its entities:
single-hop ("In what year was Penstead founded?": the town's own page says) and two-hop ("What is the
population of the town where Jory Lockhart was born?": the person's page links to the town's page, which
says). A question's canonical key is its template and entity, so a question is in one split for every seed
(:func:`harmonyrl.envs.taskfile.draw_splits`); the same entity may be asked about differently in the other
split, which is intended: the pages are the world, the questions are the tasks.

With ``worlds=N`` a task is a question *and a web*: one of N other webs (:func:`harmonyrl.tasks.web.corpus`),
with the one web's names and fresh facts, named by the task id's ``-wN`` ending (:func:`world_of`). The split
is still by question: a held-out task is a question never trained on, in one of the same N webs. Which web an
episode is in is never shown, so nothing a model memorised from its training tasks answers it.

**Validation.** With one web, ``n_val`` questions drawn after train and test from a stream of their own, among the
training questions this run does not train on (:func:`harmonyrl.envs.taskfile.draw_validation`): train and test are
unchanged, and ``n_train`` + ``n_val`` can be at most the 801 training questions. With ``worlds``, a large train
split asks every training question, so validation questions are carved from the training questions instead
(:func:`harmonyrl.envs.taskfile.carved`: ~10 %, ~80 questions, asked in the same N webs): train never asks them,
which changed the train split of ``worlds`` runs when validation was added (issue 41); test is unchanged. A task
file's validation is its ``"split": "validation"`` rows (or a carve of its train rows, when it has none).

Reward is the exact final answer (a number, or a name as the pages spell it) through
:class:`~harmonyrl.envs.reward.AnswerEnv`, optionally shaped by
:class:`~harmonyrl.envs.reward.RewardWeights`. Both tools are pure functions of the corpus: an unknown page id,
an offset past the end or a query that matches nothing is an observation, never a failure.

``open`` shows at most ``page_chars`` characters from ``offset``, cut at a word boundary, with the
``next_offset`` to read on (``null`` at the end), so long pages cost the context only what is read.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache, partial
from pathlib import Path
from typing import Literal

from harmonyrl.envs.reward import OUTCOME_ONLY, AnswerEnv, RewardWeights
from harmonyrl.envs.taskfile import Splits, TooFewProblems, carved, split_of, tasks_from, validation_rng
from harmonyrl.envs.tools import Tool, Toolbox, error_text, observation
from harmonyrl.errors import NotDemonstrable
from harmonyrl.tasks.guesses import VERBOSE_TEMPLATES, guess_answer
from harmonyrl.tasks.web import REGIONS, RIVERS, Facts, Web, corpus, facts, page_id, sentences, snippet
from harmonyrl.types import Message, Split, Task

INSTRUCTIONS = (
    "Answer the question using the offline web. search finds pages; open reads a page by id (pages mention "
    "other pages as Name [page-id]). Then answer on the final channel with only the answer: a number or a name."
)
Kind = Literal["town", "person", "company"]


@dataclass(frozen=True)
class Question:
    """A template about one entity of ``kind``. Single-hop: ``value`` reads the answer off that entity. Two-hop:
    ``hop`` follows a link to another entity (of ``answer_kind``), and ``value`` reads the answer off that one."""

    template: str  # with {name}
    kind: Kind
    answer_kind: Kind
    value: Callable[[Facts, str], object]
    hop: Callable[[Facts, str], str] | None = None

    def resolve(self, web: Facts, name: str) -> tuple[tuple[str, ...], str]:
        """(ids of the pages to read, in order; the answer)."""
        if self.hop is None:
            return (page_id(self.kind, name),), str(self.value(web, name))
        other = self.hop(web, name)
        return (page_id(self.kind, name), page_id(self.answer_kind, other)), str(self.value(web, other))


QUESTIONS: dict[str, Question] = {
    "town_founded": Question("In what year was {name} founded?", "town", "town", lambda w, t: w.towns[t].founded),
    "town_population": Question("What is the population of {name}?", "town", "town",
                                lambda w, t: w.towns[t].population),
    "town_river": Question("On which river is {name}?", "town", "town", lambda w, t: w.towns[t].river),
    "person_born": Question("In what year was {name} born?", "person", "person", lambda w, p: w.people[p].born),
    "person_birthplace": Question("In which town was {name} born?", "person", "person",
                                  lambda w, p: w.people[p].birthplace),
    "company_founder": Question("Who founded {name}?", "company", "company", lambda w, c: w.companies[c].founder),
    "company_founded": Question("In what year was {name} founded?", "company", "company",
                                lambda w, c: w.companies[c].founded),
    "company_hq": Question("In which town is {name} headquartered?", "company", "company",
                           lambda w, c: w.companies[c].hq),
    # two hops: the first page links to the one that has the answer
    "founder_born": Question("In what year was the founder of {name} born?", "company", "person",
                             lambda w, p: w.people[p].born, hop=lambda w, c: w.companies[c].founder),
    "founder_birthplace": Question("In which town was the founder of {name} born?", "company", "person",
                                   lambda w, p: w.people[p].birthplace, hop=lambda w, c: w.companies[c].founder),
    "hq_founded": Question("In what year was the town where {name} is headquartered founded?", "company", "town",
                           lambda w, t: w.towns[t].founded, hop=lambda w, c: w.companies[c].hq),
    "hq_region": Question("In which region is the town where {name} is headquartered?", "company", "town",
                          lambda w, t: w.towns[t].region, hop=lambda w, c: w.companies[c].hq),
    "birthplace_population": Question("What is the population of the town where {name} was born?", "person", "town",
                                      lambda w, t: w.towns[t].population, hop=lambda w, p: w.people[p].birthplace),
}  # fmt: skip


@cache
def _names(kind: Kind) -> tuple[str, ...]:
    """The entities of ``kind``, sorted (what questions about that kind draw from)."""
    w = corpus()
    named: dict[Kind, list[str]] = {"town": list(w.towns), "person": list(w.people), "company": list(w.companies)}
    return tuple(sorted(named[kind]))


def _draw(r: random.Random) -> tuple[str, Callable[[], tuple[str, str]]]:
    qname = r.choice(sorted(QUESTIONS))
    question = QUESTIONS[qname]
    entity = r.choice(_names(question.kind))

    def make() -> tuple[str, str]:
        return question.template.format(name=entity), question.resolve(corpus(), entity)[1]

    return f"{qname}:{entity}", make


@cache
def _patterns() -> tuple[tuple[re.Pattern[str], str], ...]:
    return tuple(
        (re.compile(re.escape(q.template).replace(re.escape("{name}"), "(?P<name>.+)")), qname)
        for qname, q in QUESTIONS.items()
    )


def parse_question(task: Task) -> tuple[str, str]:
    """(question name in :data:`QUESTIONS`, entity) of a generated question, recovered from its wording."""
    for pattern, qname in _patterns():
        m = pattern.fullmatch(task.prompt)
        if m and m["name"] in _names(QUESTIONS[qname].kind):  # "the founder of X" is not a person's name
            return qname, m["name"]
    raise NotDemonstrable(f"not a generated browse question (no template matches): {task.prompt[:80]!r}")


_WORLD_ID = re.compile(r"-w(\d+)$")


def world_of(task: Task) -> int:
    """The web a task is asked in: ``N`` for an id ending ``-wN`` (``browse-0-train-00007-w412``), else 0."""
    m = _WORLD_ID.search(task.id)
    return int(m[1]) if m else 0


def world_splits(seed: int, n_train: int, n_test: int, worlds: int, n_val: int = 0) -> Splits:
    """Distinct (question, world) pairs, worlds ``1..worlds``, ids ending ``-w{world}``.

    The split is by question, as with one web (:func:`~harmonyrl.envs.taskfile.split_of` of the same key), so a
    held-out task is a question never trained on; validation questions are the :func:`~harmonyrl.envs.taskfile.carved`
    training questions, never asked in train (module docstring); all splits draw their webs from the same N.
    Deterministic in ``seed``; validation comes from a stream of its own.
    """
    if n_train < 0 or n_test < 0 or n_val < 0:
        raise ValueError("n_train, n_val and n_test must be >= 0")
    rng = random.Random(seed)
    streams: dict[Split, random.Random] = {"train": rng, "test": rng, "validation": validation_rng("browse", seed)}
    out: dict[Split, list[Task]] = {"train": [], "validation": [], "test": []}
    want, seen = {"train": n_train, "validation": n_val, "test": n_test}, set()
    for _ in range(100 * (n_train + n_test + n_val) + 1000):
        if all(len(out[s]) >= want[s] for s in out):
            return Splits(tuple(out["train"]), tuple(out["validation"]), tuple(out["test"]))
        drawing: Split = "validation" if len(out["train"]) >= n_train and len(out["test"]) >= n_test else "train"
        r = streams[drawing]
        qname = r.choice(sorted(QUESTIONS))
        entity, world = r.choice(_names(QUESTIONS[qname].kind)), r.randint(1, worlds)
        key = f"browse:{qname}:{entity}"
        split: Split = split_of(key)
        if split == "train" and carved(key):
            split = "validation"
        if (split == "validation") != (drawing == "validation"):
            continue  # validation questions are never trained on, and drawn from their own stream only
        if (qname, entity, world) in seen or len(out[split]) >= want[split]:
            continue
        seen.add((qname, entity, world))
        answer = QUESTIONS[qname].resolve(facts(world), entity)[1]
        task_id = f"browse-{seed}-{split}-{len(out[split]):05d}-w{world}"
        out[split].append(Task(task_id, QUESTIONS[qname].template.format(name=entity), answer, split))
    raise TooFewProblems(
        f"browse: could not draw {n_train} train + {n_val} validation + {n_test} test distinct (question, web) "
        "pairs; lower env.n_train / env.n_val / env.n_test or raise env.worlds"
    )


# ---- the tools -----------------------------------------------------------------------------------------


def search_pages(web: Web, query: str, top_k: int) -> str:
    """The ``top_k`` best pages for ``query`` as JSON ``{"results": [{"id", "title", "snippet"}, ...]}``."""
    hits = web.index.search(query, top_k)
    return json.dumps({"results": [{"id": p.id, "title": p.title, "snippet": snippet(p, query)} for p, _ in hits]})


def open_page(web: Web, pid: str, offset: int, page_chars: int) -> str:
    """At most ``page_chars`` characters of the page from ``offset`` (cut after a word), as JSON."""
    page = web.pages.get(pid.strip())
    if page is None:
        return error_text(f"no page with id {pid[:80]!r}; use an id from search results, e.g. 'town-penstead'")
    if not 0 <= offset < len(page.text):
        return error_text(f"offset {offset} is outside the page (0 to {len(page.text) - 1})")
    end = offset + page_chars
    if end < len(page.text):
        space = page.text.rfind(" ", offset + 1, end + 1)
        end = space if space > offset else end
    text, next_offset = page.text[offset:end].strip(), (end if end < len(page.text) else None)
    return json.dumps({"id": page.id, "title": page.title, "text": text, "next_offset": next_offset})


def make_tools(web: Web, top_k: int = 3, page_chars: int = 400) -> list[Tool]:
    def search(query: str) -> str:
        """Search the offline web; returns the best-matching pages as JSON (id, title and a snippet of each).

        Args:
            query: Words to look for, e.g. "Granite Pharma founder".
        """
        return search_pages(web, query, top_k)

    def open(page_id: str, offset: int = 0) -> str:  # the tool's name is the function's: "open"
        """Read a page by its id; returns JSON with part of its text and the next_offset to read on (or null).

        Args:
            page_id: A page id from search results or from a page's text, e.g. "town-penstead".
            offset: Character position to start reading from (the next_offset of the previous call).
        """
        return open_page(web, page_id, offset, page_chars)

    return [Tool.from_function(search, timeout_s=5.0), Tool.from_function(open, timeout_s=5.0)]


class BrowseFactory:
    """Questions over the offline web; ``search`` and ``open`` tools shared by every episode (they are pure)."""

    name = "browse"

    def __init__(
        self,
        seed: int = 0,
        n_train: int = 500,
        n_test: int = 30,
        top_k: int = 3,
        page_chars: int = 400,
        weights: RewardWeights = OUTCOME_ONLY,
        tasks_file: str | Path | None = None,
        worlds: int = 0,
        n_val: int = 0,
    ) -> None:
        if top_k < 1 or page_chars < 50:
            raise ValueError(f"top_k must be >= 1 and page_chars >= 50, got {top_k} and {page_chars}")
        if worlds < 0:
            raise ValueError(f"worlds must be >= 0, got {worlds}")
        if worlds and tasks_file is not None:
            raise ValueError("worlds and tasks_file exclude each other: a task file names each task's web (-wN ids)")
        self.seed, self.weights = seed, weights
        if worlds:
            self._splits = world_splits(seed, n_train, n_test, worlds, n_val)
        else:
            self._splits = tasks_from(self.name, seed, n_train, n_test, _draw, tasks_file, n_val)
        self.top_k, self.page_chars = top_k, page_chars

    def tasks(self, split: Split) -> Sequence[Task]:
        return self._splits.of(split)

    def make(self, task: Task) -> AnswerEnv:
        toolbox = _toolbox(world_of(task), self.top_k, self.page_chars)
        evidence = partial(answer_read, page=answer_page(task))
        return AnswerEnv(task, toolbox, INSTRUCTIONS, self.weights, evidence=evidence)


def answer_page(task: Task) -> str | None:
    """The id of the page that states ``task``'s answer in its web; None for a question no template matches."""
    try:
        qname, entity = parse_question(task)
    except NotDemonstrable:
        return None
    return QUESTIONS[qname].resolve(facts(world_of(task)), entity)[0][-1]


def answer_read(answer: str, results: Sequence[tuple[Message, Message]], page: str | None) -> bool:
    """Whether the episode read ``answer`` on ``page`` (any page if None): an ``open`` of it whose text showed the
    answer, or a ``search`` result for it whose snippet did (the :data:`~harmonyrl.envs.reward.Evidence` check of
    this env). A right river or region named without reading it, one in 8 or 6 by chance, earns nothing."""
    for call, obs in results:
        try:
            body = json.loads(obs.content)
        except ValueError:
            continue
        if not isinstance(body, dict):
            continue
        if call.recipient == "functions.open":
            shown = [body]
        elif call.recipient == "functions.search" and isinstance(body.get("results"), list):
            shown = [r for r in body["results"] if isinstance(r, dict)]
        else:
            continue
        for part in shown:
            text = part.get("text", part.get("snippet"))
            if (page is None or part.get("id") == page) and isinstance(text, str) and _shows(answer, text):
                return True
    return False


@lru_cache(maxsize=64)
def _toolbox(world: int, top_k: int, page_chars: int) -> Toolbox:
    """The (pure) tools over one web, shared by every episode asked in it."""
    return Toolbox(make_tools(corpus(world), top_k, page_chars))


# ---- the scripted expert --------------------------------------------------------------------------------


def _call(tool: str, arguments: dict[str, object]) -> Message:
    return Message(role="assistant", channel="commentary", recipient=f"functions.{tool}", content_type="json",
                   content=json.dumps(arguments))  # fmt: skip


def guess(answer: str, rng: random.Random) -> str:
    """A plausible wrong answer: other digits for a number, another name of the same kind for a name."""
    if answer.isdigit():
        return guess_answer(int(answer), rng)
    pools = (_names("town"), _names("person"), REGIONS, RIVERS)
    pool = next((p for p in pools if answer in p), pools[0])
    return rng.choice([x for x in pool if x != answer])


def _shows(needed: str, text: str) -> bool:
    """``needed`` appears as a whole word or id (``1418`` is not shown by ``141800``)."""
    return re.search(rf"(?<![\w-]){re.escape(needed)}(?![\w-])", text) is not None


def cited_sentence(text: str, answer: str) -> str:
    """The first sentence of a page's ``text`` that shows ``answer`` (as :func:`_shows` reads it)."""
    return next(s for s in sentences(text) if _shows(answer, s))


def expert_demo(
    task: Task,
    rng: random.Random,
    p_tool: float = 0.8,
    p_verbose: float = 0.0,
    top_k: int = 3,
    page_chars: int = 400,
    cite: bool = False,
) -> list[Message]:
    """search(entity) → open each page of the question's chain (reading on until what is needed shows) → answer.

    The observations are the tools' real outputs (the tools are pure functions, so this runs nothing but
    them); ``top_k`` and ``page_chars`` must match the factory's. Imperfect as the other experts: with
    probability ``1 - p_tool`` it guesses without browsing (:func:`guess`); with probability ``p_verbose`` it
    wraps the right answer in a sentence the grader scores 0. With ``cite`` the answer turn first writes, on the
    analysis channel, the question and the sentence of the last page read that states the answer
    (``Question: … The page says: …``), so the answer is copied from a line just written rather than looked up
    across the episode (``env.cite``, docs/envs.md).
    """
    qname, entity = parse_question(task)  # first: a task no template matches fails whichever branch is drawn
    if rng.random() >= p_tool:
        return [Message(role="assistant", channel="final", content=guess(task.answer, rng))]
    web = corpus(world_of(task))
    chain, answer = QUESTIONS[qname].resolve(web, entity)
    out = [_call("search", {"query": entity}), observation("search", search_pages(web, entity, top_k))]
    text = ""
    for pid, needed in zip(chain, (*chain[1:], answer), strict=True):
        offset: int | None = 0
        while offset is not None:
            args: dict[str, object] = {"page_id": pid} if offset == 0 else {"page_id": pid, "offset": offset}
            result = open_page(web, pid, offset, page_chars)
            out += [_call("open", args), observation("open", result)]
            body = json.loads(result)
            text = body["text"]
            offset = None if _shows(needed, text) else body["next_offset"]
    if cite:
        quote = f"Question: {task.prompt} The page says: {cited_sentence(text, answer)}"
        out.append(Message(role="assistant", channel="analysis", content=quote))
    verbose = p_verbose > 0 and rng.random() < p_verbose  # p_verbose 0 draws nothing: demo streams stay put
    final = rng.choice(VERBOSE_TEMPLATES).format(answer) if verbose else answer
    return [*out, Message(role="assistant", channel="final", content=final)]
