"""The offline web of the ``browse`` env: ~200 generated pages about fictional towns, people and companies,
and a BM25 index over them.

    web = corpus()                      # built once per process from CORPUS_SEED: identical everywhere
    web.index.search("Ember Foundry", k=3)   # [(page, score), ...], best first
    web.pages["company-ember-foundry"].text
    corpus(7).companies["Ember Foundry"].founder   # web 7: the same names, its own facts and links

**Why generated, not shipped.** Facts about fictional entities cannot be known in advance (no model has seen
them), every answer is checkable against the generator's own records, and the corpus costs no data file. The
generator depends only on :data:`CORPUS_SEED`, never on a factory's seed, so tasks, expert demos and the
pages the tools return agree on every machine.

**Pages.** 50 towns, 90 people and 60 companies. Each page states its facts in the first sentences (a town's
founding year, population, region and river; a person's birth year, birthplace and occupation; a company's
founding year, founder, headquarters and size), then a few filler sentences and lists of related pages.
Other pages are referred to as ``Name [page-id]``, so a two-hop question is answered by following the id
printed on the first page. Every name is unique across the corpus (towns, people and companies are built from
disjoint word lists), and filler sentences only use small counts (3-60), never a year or a population, so each
question has exactly one answer on its page.

**Other webs.** ``corpus(n)`` for ``n > 0`` keeps web 0's names and page ids and draws every fact, link and
filler sentence afresh from its own seed. A model trained on one web for many epochs learns its facts (the
browse warm start did: it answered held-out questions from a training question's page); asked across many
webs, a question can only be answered by reading the pages of its own.

**Search.** Okapi BM25 (k1 = 1.5, b = 0.75) over lower-cased alphanumeric tokens, title tokens counted three
times so a page ranks first for its own name; ties go to the earlier page. It is a few dozen lines of
standard library, so a dependency (the PyPI BM25 packages mostly bring numpy or a stemmer) is not worth it
for 200 pages; a query scores every page in under a millisecond.
"""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

CORPUS_SEED = 20261122
N_TOWNS, N_PEOPLE, N_COMPANIES = 50, 90, 60
REGIONS = ("Aldmere", "Brisk Coast", "Corvath", "Dunmoor", "Essling Vale", "Farrowdown")
RIVERS = ("Ambel", "Cresk", "Dovey", "Istra", "Lune", "Morrow", "Sable", "Tarn")
_TOWN_HEADS = ("Ash", "Bram", "Cal", "Dun", "Elm", "Fen", "Gil", "Hal", "Ivel", "Kel", "Lor", "Mar", "Nor", "Oss",
               "Pen", "Quar", "Ros", "Stan", "Tor", "Ulm", "Vey", "Wren", "Yar", "Zel")  # fmt: skip
_TOWN_TAILS = ("ford", "holm", "by", "wick", "mere", "stead", "ton", "ridge", "haven", "moor")
_FIRST = ("Alba", "Bennet", "Cora", "Dorian", "Edda", "Fintan", "Greer", "Hollis", "Ilse", "Jory", "Kaia", "Lorcan",
          "Maren", "Niall", "Odile", "Perrin", "Quinta", "Rufus", "Selma", "Tobin")  # fmt: skip
_LAST = ("Ashcombe", "Brannock", "Corwell", "Delacroix", "Everly", "Fairweather", "Galloway", "Hawthorne", "Ingram",
         "Jessop", "Kimber", "Lockhart", "Merriweather", "Nettleton", "Orwin", "Pemberton", "Quayle", "Radcliffe",
         "Stroud", "Thackeray")  # fmt: skip
_BRANDS = ("Amber", "Beacon", "Cobalt", "Drift", "Ember", "Falcon", "Granite", "Harbor", "Indigo", "Juniper",
           "Kestrel", "Lumen", "Meadow", "Nimbus", "Orchid", "Pioneer", "Quill", "Russet", "Summit",
           "Tidal")  # fmt: skip
_INDUSTRIES = {"Mills": "flour milling", "Foundry": "metal casting", "Textiles": "textile", "Shipping": "shipping",
               "Press": "publishing", "Brewery": "brewing", "Optics": "optics", "Ceramics": "ceramics",
               "Robotics": "robotics", "Pharma": "pharmaceutical"}  # fmt: skip
_JOBS = ("engineer", "painter", "chemist", "architect", "merchant", "composer", "botanist", "shipwright", "banker")
_TOWN_FILLER = ("A market is held in the main square every {day}.", "The old stone bridge is a local landmark.",
                "Its library keeps a collection of {n} maps.", "The town is known for its {thing}.")  # fmt: skip
_PERSON_FILLER = ("{name} was fond of {thing}.", "Friends remembered {name} as patient and exact.",
                  "{name} kept a diary of {n} volumes.")  # fmt: skip
_COMPANY_FILLER = ("Its emblem features {thing}.", "The company runs {n} workshops.",
                   "It is known for careful record keeping.")  # fmt: skip
_THINGS = ("lanterns", "orchards", "clock towers", "woollen scarves", "kites", "rowing boats", "honey", "chess")
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
_TOKEN = re.compile(r"[a-z0-9]+")


@dataclass(frozen=True)
class Town:
    name: str
    region: str
    river: str
    founded: int
    population: int


@dataclass(frozen=True)
class Person:
    name: str
    born: int
    birthplace: str  # a town name
    job: str


@dataclass(frozen=True)
class Company:
    name: str
    founded: int
    founder: str  # a person name
    hq: str  # a town name
    employees: int


@dataclass(frozen=True)
class Page:
    id: str
    title: str
    text: str


def page_id(kind: str, name: str) -> str:
    """``town-ashford``, ``person-cora-galloway``, ``company-ember-foundry``."""
    return f"{kind}-{'-'.join(_TOKEN.findall(name.lower()))}"


def tokenize(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


class SearchIndex:
    """Okapi BM25 over pages (title tokens weighted ×3). Immutable after construction; safe across threads."""

    def __init__(self, pages: tuple[Page, ...], k1: float = 1.5, b: float = 0.75) -> None:
        self.pages, self.k1, self.b = pages, k1, b
        self._tf = [Counter(tokenize(p.title) * 3 + tokenize(p.text)) for p in pages]
        self._len = [sum(tf.values()) for tf in self._tf]
        self._avg = sum(self._len) / len(pages)
        df = Counter(term for tf in self._tf for term in tf)
        n = len(pages)
        self._idf = {t: math.log(1 + (n - d + 0.5) / (d + 0.5)) for t, d in df.items()}

    def score(self, i: int, terms: list[str]) -> float:
        tf, norm = self._tf[i], self.k1 * (1 - self.b + self.b * self._len[i] / self._avg)
        return sum(self._idf.get(t, 0.0) * tf[t] * (self.k1 + 1) / (tf[t] + norm) for t in terms if t in tf)

    def search(self, query: str, k: int) -> list[tuple[Page, float]]:
        """The ``k`` best pages with a positive score, best first (ties: corpus order)."""
        terms = tokenize(query)
        scored = [(s, i) for i in range(len(self.pages)) if (s := self.score(i, terms)) > 0]
        scored.sort(key=lambda x: (-x[0], x[1]))
        return [(self.pages[i], s) for s, i in scored[:k]]


def sentences(text: str) -> list[str]:
    """``text`` split after each ``.``, ``!`` or ``?`` that a space follows (a page's sentences)."""
    return [s for s in re.split(r"(?<=[.!?])\s+", text) if s]


def snippet(page: Page, query: str, max_chars: int = 150) -> str:
    """The page's sentence sharing most words with the query (the first one on ties), cut to ``max_chars``."""
    terms = set(tokenize(query))
    best = max(sentences(page.text), key=lambda s: len(terms & set(tokenize(s))))  # max keeps the first of equals
    return best if len(best) <= max_chars else best[: max_chars - 1].rstrip() + "…"


@dataclass(frozen=True)
class Facts:
    """A web's entities by name: what its questions are answered from."""

    towns: dict[str, Town]
    people: dict[str, Person]
    companies: dict[str, Company]


@dataclass(frozen=True)
class Web(Facts):
    """A web's facts with the pages that state them and the search index over those pages."""

    pages: dict[str, Page]
    index: SearchIndex


def _entities(
    r: random.Random, names: tuple[list[str], list[str], list[str]] | None = None
) -> tuple[list[Town], list[Person], list[Company]]:
    """The entities and their facts, drawn from ``r``; ``names`` (towns, people, companies, in order) keeps
    another world's names instead of drawing them, so only the facts and links are new."""
    town_names, person_names, company_names = names or (None, None, None)
    towns = [
        Town(name, r.choice(REGIONS), r.choice(RIVERS), r.randint(1150, 1850), r.randint(800, 250_000))
        for name in town_names or r.sample([h + t for h in _TOWN_HEADS for t in _TOWN_TAILS], N_TOWNS)
    ]
    people = [
        Person(name, r.randint(1801, 1960), r.choice(towns).name, r.choice(_JOBS))
        for name in person_names or r.sample([f"{f} {la}" for f in _FIRST for la in _LAST], N_PEOPLE)
    ]
    companies = []
    for name in company_names or r.sample([f"{b} {i}" for b in _BRANDS for i in _INDUSTRIES], N_COMPANIES):
        founder = r.choice(people)
        companies.append(
            Company(name, founder.born + r.randint(22, 55), founder.name, r.choice(towns).name, r.randint(12, 9000))
        )
    return towns, people, companies


def _link(kind: str, name: str) -> str:
    return f"{name} [{page_id(kind, name)}]"


def _filler(r: random.Random, templates: tuple[str, ...], name: str) -> str:
    picked = r.sample(templates, 2)
    return " ".join(
        t.format(name=name, day=r.choice(_DAYS), n=r.randint(3, 60), thing=r.choice(_THINGS)) for t in picked
    )


def _pages(r: random.Random, towns: list[Town], people: list[Person], companies: list[Company]) -> list[Page]:
    pages = []
    for t in towns:
        born = [_link("person", p.name) for p in people if p.birthplace == t.name]
        based = [_link("company", c.name) for c in companies if c.hq == t.name]
        text = (f"{t.name} is a town in the {t.region} region, on the river {t.river}. {t.name} was founded in "
                f"{t.founded}. It has a population of {t.population}. {_filler(r, _TOWN_FILLER, t.name)}")  # fmt: skip
        text += f" People born in {t.name}: {', '.join(born)}." if born else ""
        text += f" Companies based in {t.name}: {', '.join(based)}." if based else ""
        pages.append(Page(page_id("town", t.name), t.name, text))
    for p in people:
        founded = [f"{_link('company', c.name)} in {c.founded}" for c in companies if c.founder == p.name]
        text = (f"{p.name} was a {p.job}. {p.name} was born in {p.born} in {_link('town', p.birthplace)}. "
                f"{_filler(r, _PERSON_FILLER, p.name)}")  # fmt: skip
        text += f" {p.name} founded {' and '.join(founded)}." if founded else ""
        pages.append(Page(page_id("person", p.name), p.name, text))
    for c in companies:
        kind = _INDUSTRIES[c.name.split()[-1]]
        article = "an" if kind[0] in "aeiou" else "a"
        text = (f"{c.name} is {article} {kind} company headquartered in {_link('town', c.hq)}. It was founded in "
                f"{c.founded} by {_link('person', c.founder)}. It employs {c.employees} people. "
                f"{_filler(r, _COMPANY_FILLER, c.name)}")  # fmt: skip
        pages.append(Page(page_id("company", c.name), c.name, text))
    return pages


@lru_cache(maxsize=4096)
def facts(world: int = 0) -> Facts:
    """The facts of web number ``world`` (what :func:`corpus` writes its pages from), without the pages.

    World 0 is the one web, from :data:`CORPUS_SEED`. Every other world has world 0's names (so every
    question names an entity that exists in it) with facts and links drawn afresh from its own seed: the
    founding years, founders and birthplaces a model may have memorised from one world are wrong in the next,
    so a question about world ``n`` is answered by reading world ``n``'s pages.
    """
    towns, people, companies = _draw_world(world)[1]
    return Facts({t.name: t for t in towns}, {p.name: p for p in people}, {c.name: c for c in companies})


def _draw_world(world: int) -> tuple[random.Random, tuple[list[Town], list[Person], list[Company]]]:
    """The world's generator and its entities; the generator, drawn on, writes the pages' filler."""
    if world < 0:
        raise ValueError(f"world must be >= 0, got {world}")
    if world == 0:
        r = random.Random(CORPUS_SEED)
        return r, _entities(r)
    zero = facts(0)
    r = random.Random(f"{CORPUS_SEED}:{world}")  # a str seed is hashed (sha512): the same on every machine
    names = (list(zero.towns), list(zero.people), list(zero.companies))
    return r, _entities(r, names)


@lru_cache(maxsize=64)
def corpus(world: int = 0) -> Web:
    """Web number ``world`` (:func:`facts`) with its pages and index, built on first use (~20 ms; the 64
    most recently used are kept). ``corpus()`` is the one web of the default env."""
    r, (towns, people, companies) = _draw_world(world)
    pages = _pages(r, towns, people, companies)
    return Web(
        towns={t.name: t for t in towns},
        people={p.name: p for p in people},
        companies={c.name: c for c in companies},
        pages={p.id: p for p in pages},
        index=SearchIndex(tuple(pages)),
    )
