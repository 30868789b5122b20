"""Browse env: the generated offline web and its BM25 search, questions whose answers are on the pages,
paginated reading, splits, task files, and the expert replayed through the real tools."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import re
from collections.abc import Sequence
from pathlib import Path

import pytest

from harmonyrl.envs.checker import assert_env_ok
from harmonyrl.envs.reward import AnswerEnv, RewardWeights
from harmonyrl.envs.taskfile import TaskFileError
from harmonyrl.tasks.browse import (
    QUESTIONS,
    BrowseFactory,
    _names,
    _shows,
    answer_page,
    answer_read,
    cited_sentence,
    expert_demo,
    guess,
    open_page,
    parse_question,
    search_pages,
    world_of,
    world_splits,
)
from harmonyrl.tasks.guesses import VERBOSE_TEMPLATES
from harmonyrl.tasks.web import REGIONS, RIVERS, SearchIndex, corpus, facts, page_id, tokenize
from harmonyrl.types import Message, StepResult, Task


def small() -> BrowseFactory:
    return BrowseFactory(seed=0, n_train=200, n_test=20)


FACTORY = small()
TRAIN, TEST = FACTORY.tasks("train"), FACTORY.tasks("test")
WEB = corpus()


def play(task: Task, actions: Sequence[Sequence[Message]], factory: BrowseFactory = FACTORY) -> list[StepResult]:
    async def go() -> list[StepResult]:
        env: AnswerEnv = factory.make(task)
        await env.reset()
        return [await env.step(a) for a in actions]

    return asyncio.run(go())


def call(tool: str, **arguments: object) -> list[Message]:
    content = json.dumps(arguments)
    return [Message("assistant", content, channel="commentary", recipient=f"functions.{tool}", content_type="json")]


def final(content: str) -> list[Message]:
    return [Message("assistant", content, channel="final")]


def test_check_env_passes() -> None:
    assert_env_ok(FACTORY, rebuild=small)


def test_corpus_is_fixed_linked_and_searchable() -> None:
    assert (len(WEB.pages), len(WEB.towns), len(WEB.people), len(WEB.companies)) == (200, 50, 90, 60)
    assert WEB.pages["town-penstead"].text.startswith(
        "Penstead is a town in the Essling Vale region, on the river Sable. Penstead was founded in 1418. "
        "It has a population of 176255."
    )  # the same on every machine: the corpus depends on CORPUS_SEED only
    for page in WEB.pages.values():
        assert set(re.findall(r"\[([a-z0-9-]+)\]", page.text)) <= set(WEB.pages), page.id
        assert WEB.index.search(page.title, 1)[0][0].id == page.id  # a page ranks first for its own name
    assert len({p.title for p in WEB.pages.values()}) == 200


def test_bm25_against_a_hand_computed_score() -> None:
    from harmonyrl.tasks.web import Page

    pages = (Page("a", "x", "apple apple pear"), Page("b", "y", "pear plum"))
    index = SearchIndex(pages, k1=1.5, b=0.75)
    # title tokens count 3 times: a = [x, x, x, apple, apple, pear] (6 tokens), b = [y, y, y, pear, plum] (5).
    # "apple" is in a only: idf = ln(1 + (2 - 1 + 0.5) / (1 + 0.5)) = ln 2; avgdl = 5.5;
    # norm_a = k1 * (1 - b + b * 6 / 5.5); tf = 2 → score = ln 2 * 2 * (k1 + 1) / (2 + norm_a) = ln 2 * 5 / (2 + norm_a)
    norm = 1.5 * (0.25 + 0.75 * 6 / 5.5)
    assert index.search("apple", 5) == [(pages[0], pytest.approx(0.6931471805599453 * 5 / (2 + norm)))]
    assert [p.id for p, _ in index.search("pear", 5)] == ["b", "a"]  # equal tf and idf: the shorter page wins
    assert index.search("kiwi", 5) == [] and tokenize("Ember-Foundry's 1910!") == ["ember", "foundry", "s", "1910"]


def test_every_question_is_answered_on_its_pages() -> None:
    n = 0
    for question in QUESTIONS.values():
        for entity in _names(question.kind):
            chain, answer = question.resolve(WEB, entity)
            assert chain[0] == page_id(question.kind, entity) and answer
            for here, there in itertools.pairwise(chain):
                assert f"[{there}]" in WEB.pages[here].text  # the first page links to the second
            assert answer in WEB.pages[chain[-1]].text
            n += 1
    assert n == 840
    assert TRAIN[0] == Task(
        "browse-0-train-00000", "In what year was the town where Pioneer Optics is headquartered founded?", "1539",
        "train",
    )  # fmt: skip
    assert {parse_question(t)[0] for t in TRAIN} == set(QUESTIONS)
    with pytest.raises(ValueError, match="not a generated browse question"):
        parse_question(Task("x", "Who founded Rome?", "Romulus", "train"))


def test_splits_deterministic_prefix_stable_and_disjoint() -> None:
    big = BrowseFactory(seed=0, n_train=400, n_test=39)
    assert (big.tasks("train")[:200], big.tasks("test")[:20]) == (TRAIN, TEST)
    other = BrowseFactory(seed=1, n_train=200, n_test=20)
    assert other.tasks("train") != TRAIN
    train = {t.prompt for f in (big, other) for t in f.tasks("train")}
    assert not train & {t.prompt for f in (big, other) for t in f.tasks("test")}
    with pytest.raises(ValueError, match="could not draw"):  # only 39 questions are held out
        BrowseFactory(n_train=10, n_test=40)


def test_search_and_open_tools() -> None:
    [found] = play(TRAIN[0], [call("search", query="Penstead")])
    results = json.loads(found.observations[0].content)["results"]
    assert [r["id"] for r in results] == ["town-penstead", "person-ilse-delacroix", "person-hollis-pemberton"]
    assert results[0]["snippet"] == "Penstead is a town in the Essling Vale region, on the river Sable."
    assert json.loads(search_pages(WEB, "", 3)) == {"results": []}
    [opened] = play(TRAIN[0], [call("open", page_id="person-jory-lockhart")])
    assert json.loads(opened.observations[0].content) == {
        "id": "person-jory-lockhart", "title": "Jory Lockhart", "text": WEB.pages["person-jory-lockhart"].text,
        "next_offset": None,
    }  # fmt: skip
    # a bad page id or offset is the tool's answer (the call ran: tool_error 0); bad arguments never reach it (1)
    for args, error, tool_error in (
        ({"page_id": "town-atlantis"}, "no page with id 'town-atlantis'", 0.0),
        ({"page_id": "town-penstead", "offset": 10_000}, "offset 10000 is outside the page", 0.0),
        ({"page_id": "town-penstead", "offset": "abc"}, "invalid arguments: offset", 1.0),
        ({"url": "town-penstead"}, "invalid arguments", 1.0),
    ):
        [result] = play(TRAIN[0], [call("open", **args)])
        assert (result.failure, result.terminated, result.info) == (None, False, {"tool_error": tool_error})
        assert error in json.loads(result.observations[0].content)["error"]


def test_pages_read_in_windows_reassemble_exactly() -> None:
    for page in WEB.pages.values():
        parts, offset = [], 0
        while offset is not None:
            body = json.loads(open_page(WEB, page.id, offset, 60))
            assert len(body["text"]) <= 60
            parts.append(body["text"])
            offset = body["next_offset"]
        assert " ".join(parts) == page.text


def test_expert_replays_to_full_reward_and_shows_real_tool_output() -> None:
    tasks = [*TRAIN[:10], TEST[0]]
    hops = set()
    for i, task in enumerate(tasks):
        demo = expert_demo(task, random.Random(i), p_tool=1.0)
        calls = [m for m in demo if m.role == "assistant" and m.channel != "final"]
        results = play(task, [[m] for m in calls] + [[demo[-1]]])
        assert [r.observations for r in results[:-1]] == [(m,) for m in demo if m.role == "tool"]
        assert (results[-1].reward, results[-1].info["correct"], demo[-1].content) == (1.0, 1.0, task.answer)
        hops.add(len(calls) - 1)  # opens per demo: 1 (single-hop) or 2 (two-hop)
    assert hops == {1, 2}


def test_expert_pages_through_narrow_windows() -> None:
    narrow = BrowseFactory(seed=0, n_train=200, n_test=2, page_chars=60)
    task = next(t for t in narrow.tasks("train") if parse_question(t)[0] == "birthplace_population")
    demo = expert_demo(task, random.Random(0), p_tool=1.0, page_chars=60)
    opens = [json.loads(m.content) for m in demo if m.recipient == "functions.open"]
    assert any("offset" in o for o in opens) and len(opens) > 2
    calls = [[m] for m in demo if m.role == "assistant" and m.channel != "final"]
    assert play(task, [*calls, [demo[-1]]], narrow)[-1].reward == 1.0


def test_cited_demo_quotes_the_question_and_the_answers_sentence_then_answers() -> None:
    tasks = [*TRAIN[:12], *TEST[:4]]
    for i, task in enumerate(tasks):
        plain = expert_demo(task, random.Random(i), p_tool=1.0)
        cited = expert_demo(task, random.Random(i), p_tool=1.0, cite=True)
        *steps, thought, answer = cited
        assert steps == plain[:-1] and answer == plain[-1]  # the same browsing, the same answer
        last_read = json.loads(steps[-1].content)["text"]
        assert thought.channel == "analysis" and thought.recipient is None
        sentence = thought.content.removeprefix(f"Question: {task.prompt} The page says: ")
        assert sentence != thought.content and sentence in last_read and _shows(task.answer, sentence)
        assert sentence.count(". ") == 0  # one sentence
        # the answer turn is the thought and the answer together; the grader reads the final message
        calls = [[m] for m in steps if m.role == "assistant"]
        assert play(task, [*calls, [thought, answer]])[-1].reward == 1.0
    assert cited_sentence("Lorby is a town. Lorby was founded in 1626. It has 16260 people.", "1626") == (
        "Lorby was founded in 1626."
    )


def test_an_answer_written_in_analysis_is_not_read_from_a_page() -> None:
    task = next(t for t in TRAIN if parse_question(t)[0] == "town_river")
    page = answer_page(task)
    quote = [Message("assistant", f"The page says: on the river {task.answer}.", channel="analysis")]
    unread = play(task, [[*quote, *final(task.answer)]])[-1]
    assert (unread.reward, unread.info["ungrounded"]) == (0.0, 1.0)
    assert play(task, [call("open", page_id=page), [*quote, *final(task.answer)]])[-1].reward == 1.0
    ends_on_thought = play(task, [call("open", page_id=page), quote])[-1]  # no final message: no answer
    assert (ends_on_thought.reward, ends_on_thought.info["format_error"]) == (0.0, 1.0)


def test_wrong_guessed_verbose_and_miscased_answers_earn_nothing() -> None:
    task = next(t for t in TRAIN if parse_question(t)[0] == "company_founder")  # a name answer
    [guess] = expert_demo(task, random.Random(0), p_tool=0.0)
    assert guess.content in WEB.people and guess.content != task.answer
    *_, verbose = expert_demo(task, random.Random(0), p_tool=1.0, p_verbose=1.0)
    assert verbose.content in {v.format(task.answer) for v in VERBOSE_TEMPLATES}
    for content in (guess.content, verbose.content, task.answer.lower(), ""):
        [result] = play(task, [final(content)])
        assert (result.reward, result.terminated, result.info["correct"]) == (0.0, True, 0.0)
    opened = call("open", page_id=answer_page(task))
    right = play(task, [opened, final(f" {task.answer}.\n")])[-1]  # surrounding space and one period are tolerated
    assert right.reward == 1.0
    shaped = BrowseFactory(seed=0, n_train=200, n_test=20, weights=RewardWeights(outcome=0.5, tool_use=0.5))
    results = play(task, [call("search", query=task.prompt), final(guess.content)], shaped)
    assert results[-1].reward == 0.5 and results[-1].info["reward/tool_use"] == 0.5


def test_guesses_are_wrong_answers_of_the_right_kind() -> None:
    rng = random.Random(0)
    for answer, pool in (
        ("Sable", RIVERS),
        ("Farrowdown", REGIONS),
        ("Penstead", WEB.towns),
        ("Jory Lockhart", WEB.people),
    ):
        guessed = [guess(answer, rng) for _ in range(20)]
        assert all(g in pool and g != answer for g in guessed)
    assert guess("1418", random.Random(0)) == "9718"  # the calculator's digit-changing guesser


def test_expert_mix_and_determinism() -> None:
    demos = [expert_demo(t, random.Random(i), p_tool=0.5) for i, t in enumerate(TRAIN)]
    assert abs(sum(len(d) > 1 for d in demos) / len(demos) - 0.5) < 0.1
    guesses = [d[0].content == t.answer for t, d in zip(TRAIN, demos, strict=True) if len(d) == 1]
    assert sum(guesses) / len(guesses) < 0.1
    assert expert_demo(TRAIN[5], random.Random(1)) == expert_demo(TRAIN[5], random.Random(1))


def test_tasks_file(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    rows = [
        {"id": "q1", "prompt": "Who founded Granite Pharma?", "answer": "Lorcan Jessop", "split": "train"},
        {"id": "q2", "prompt": "In what year was Penstead founded?", "answer": 1418, "split": "test"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    factory = BrowseFactory(tasks_file=path)
    assert [t.id for t in factory.tasks("train")] == ["q1"] and factory.tasks("test")[0].answer == "1418"
    read = call("open", page_id="town-penstead")
    assert play(factory.tasks("test")[0], [read, final("1418")], factory)[-1].reward == 1.0
    path.write_text('{"id": "q1", "prompt": "Who?", "anwser": "x", "split": "train"}\n')
    with pytest.raises(TaskFileError, match=r"tasks.jsonl:1: missing key\(s\) \['answer'\]"):
        BrowseFactory(tasks_file=path)


def test_bad_settings_are_one_line_errors() -> None:
    with pytest.raises(ValueError, match="top_k must be >= 1 and page_chars >= 50, got 0 and 400"):
        BrowseFactory(top_k=0)


def test_config_builds_the_factory_and_a_matching_expert() -> None:
    from harmonyrl.config import ConfigError, load_config
    from harmonyrl.tasks.factory import expert_for, make_factory

    overrides = ["env.name=browse", "env.n_train=20", "env.n_test=5", "env.top_k=2", "env.page_chars=60",
                 "env.p_tool=1.0", "env.p_verbose=0.0"]  # fmt: skip
    cfg = load_config(None, overrides)
    built = make_factory(cfg.env, seed=0)
    assert isinstance(built, BrowseFactory) and (built.top_k, built.page_chars) == (2, 60)
    assert built.tasks("train") == TRAIN[:20]
    task = built.tasks("train")[0]
    demo = expert_for(cfg.env)(task, random.Random(0))  # the env's knobs, bound
    assert demo == expert_demo(task, random.Random(0), 1.0, 0.0, top_k=2, page_chars=60)
    assert len(json.loads(demo[1].content)["results"]) == 2
    calls = [[m] for m in demo if m.role == "assistant" and m.channel != "final"]
    assert play(task, [*calls, [demo[-1]]], built)[-1].reward == 1.0
    cited = expert_for(load_config(None, [*overrides, "env.cite=true"]).env)(task, random.Random(0))
    assert cited == expert_demo(task, random.Random(0), 1.0, 0.0, top_k=2, page_chars=60, cite=True) != demo
    with pytest.raises(ConfigError, match=r"env.n_test is 40, but the one web has 39 held-out questions; set env"):
        load_config(None, ["env.name=browse", "env.n_test=40"])
    worlds = make_factory(load_config(None, ["env.name=browse", "env.n_test=40", "env.worlds=50"]).env, seed=0)
    assert isinstance(worlds, BrowseFactory) and len(worlds.tasks("test")) == 40
    assert {world_of(t) for t in worlds.tasks("test")} <= set(range(1, 51))
    with pytest.raises(ConfigError, match=r"env\.worlds and env\.tasks_file exclude each other"):
        load_config(None, ["env.name=browse", "env.worlds=5", "env.tasks_file=tasks.jsonl"])
    with pytest.raises(ValueError, match="worlds must be >= 0, got -1"):
        BrowseFactory(worlds=-1)
    with pytest.raises(ValueError, match="worlds and tasks_file exclude each other"):
        BrowseFactory(worlds=5, tasks_file="tasks.jsonl")


# ---- many webs: the same names, fresh facts ----------------------------------------------------------------


def test_other_webs_keep_the_names_and_redraw_the_facts() -> None:
    zero = facts(0)  # world 0 is the one web, unchanged
    assert (zero.towns, zero.people, zero.companies) == (WEB.towns, WEB.people, WEB.companies)
    one, two = corpus(1), corpus(2)
    assert list(one.towns) == list(two.towns) == list(WEB.towns) and list(one.people) == list(WEB.people)
    assert sorted(one.pages) == sorted(WEB.pages)  # every page id exists in every web
    founded = [(WEB.towns[t].founded, one.towns[t].founded, two.towns[t].founded) for t in WEB.towns]
    assert sum(len(set(f)) == 3 for f in founded) > 40  # of 50 towns: the years a model learnt are wrong elsewhere
    assert sum(WEB.companies[c].founder != one.companies[c].founder for c in WEB.companies) > 50
    assert facts(2).people == two.people and corpus.__wrapped__(2).pages == two.pages  # rebuilt: identical
    with pytest.raises(ValueError, match="world must be >= 0, got -1"):
        facts(-1)


def test_world_tasks_are_distinct_pairs_split_by_question_and_answered_in_their_web() -> None:
    train, _, test = world_splits(seed=0, n_train=300, n_test=60, worlds=20)
    assert (train, test) == world_splits(seed=0, n_train=300, n_test=60, worlds=20)[::2]
    assert train[0].id == "browse-0-train-00000-w" + str(world_of(train[0])) and len(test) == 60
    pairs = [(t.prompt, world_of(t)) for t in (*train, *test)]
    assert len(set(pairs)) == 360 and {w for _, w in pairs} == set(range(1, 21))
    assert not {t.prompt for t in train} & {t.prompt for t in test}  # a held-out question is never trained on
    assert {t.prompt for t in test} <= {t.prompt for t in BrowseFactory(n_train=1, n_test=39).tasks("test")}
    factory = BrowseFactory(seed=0, n_train=300, n_test=60, worlds=20)
    assert (tuple(factory.tasks("train")), tuple(factory.tasks("test"))) == (train, test)
    differs = 0
    for i, task in enumerate([*train[:12], *test[:4]]):
        qname, entity = parse_question(task)
        assert task.answer == QUESTIONS[qname].resolve(facts(world_of(task)), entity)[1]
        demo = expert_demo(task, random.Random(i), p_tool=1.0)  # reads the task's web through the env's tools
        calls = [[m] for m in demo if m.role == "assistant" and m.channel != "final"]
        results = play(task, [*calls, [demo[-1]]], factory)
        assert [r.observations for r in results[:-1]] == [(m,) for m in demo if m.role == "tool"]
        assert results[-1].reward == 1.0
        memorised = QUESTIONS[qname].resolve(WEB, entity)[1]  # the one web's answer to the same question
        if memorised != task.answer:
            differs += 1
            assert play(task, [final(memorised)], factory)[-1].reward == 0.0
    assert differs >= 12
    with pytest.raises(ValueError, match=r"could not draw 10 train \+ 0 validation \+ 800 test distinct \(question"):
        world_splits(seed=0, n_train=10, n_test=800, worlds=20)  # 39 held-out questions x 20 webs = 780


def test_a_tasks_file_id_picks_the_web() -> None:
    task = Task("mine-w7", "In what year was Penstead founded?", str(facts(7).towns["Penstead"].founded), "test")
    assert (world_of(task), world_of(Task("mine", "", "", "test")), world_of(Task("w7x", "", "", "test"))) == (7, 0, 0)
    demo = expert_demo(task, random.Random(0), p_tool=1.0)
    assert str(facts(7).towns["Penstead"].founded) in demo[-2].content and demo[-1].content == task.answer
    assert play(task, [call("open", page_id="town-penstead"), final(task.answer)])[-1].reward == 1.0


# ---- the answer must be read: a right answer guessed earns nothing ---------------------------------------


def test_a_right_answer_counts_only_if_read_on_its_page() -> None:
    river = next(t for t in TRAIN if parse_question(t)[0] == "town_river")  # 8 rivers: 1 in 8 by chance
    town = parse_question(river)[1]
    page = answer_page(river)
    assert page == page_id("town", town) and _shows(river.answer, WEB.pages[page].text)
    unread = play(river, [final(river.answer)])[-1]
    assert (unread.reward, unread.info["correct"], unread.info["ungrounded"]) == (0.0, 0.0, 1.0)
    other = next(p for p in WEB.pages.values() if p.id != page and _shows(river.answer, p.text))
    assert play(river, [call("open", page_id=other.id), final(river.answer)])[-1].reward == 0.0  # not its page
    guessed = play(river, [call("search", query=other.title), final(river.answer)])  # another page's results
    hits = json.loads(guessed[0].observations[0].content)["results"]
    assert page not in [h["id"] for h in hits] and guessed[-1].reward == 0.0
    snippet = play(river, [call("search", query=f"{town} river"), final(river.answer)])  # its page's snippet says
    assert _shows(river.answer, json.loads(snippet[0].observations[0].content)["results"][0]["snippet"])
    assert snippet[-1].reward == 1.0 and snippet[-1].info["ungrounded"] == 0.0
    read = play(river, [call("open", page_id=page), final(river.answer)])[-1]
    assert (read.reward, read.info["ungrounded"]) == (1.0, 0.0)
    two_hop = next(t for t in TRAIN if parse_question(t)[0] == "hq_founded")
    first = page_id("company", parse_question(two_hop)[1])
    assert answer_page(two_hop) != first  # the answer is on the second page: the first one is not enough
    assert play(two_hop, [call("open", page_id=first), final(two_hop.answer)])[-1].reward == 0.0


def test_answer_read_ignores_errors_other_tools_and_cut_numbers() -> None:
    def result(tool: str, content: str) -> tuple[Message, Message]:
        return call(tool, page_id="x")[0], Message("tool", content, name=f"functions.{tool}")

    body = json.dumps({"id": "town-penstead", "title": "Penstead", "text": "founded in 1418.", "next_offset": None})
    assert answer_read("1418", [result("open", body)], page="town-penstead")
    assert answer_read("1418", [result("open", body)], page=None)  # a task file's own question: any page
    assert not answer_read("1418", [result("open", body)], page="town-ashford")
    assert not answer_read("141", [result("open", body)], page=None)  # part of a number is not the number
    assert not answer_read("1418", [result("recall", body)], page=None)  # notes the policy wrote are not pages
    for junk in ("not json", "[1418]", json.dumps({"error": "1418"}), json.dumps({"results": "1418"})):
        assert not answer_read("1418", [result("open", junk), result("search", junk)], page=None)
    custom = Task("c1", "Which town founded in 1418 has a bridge?", "Penstead", "test")
    assert answer_page(custom) is None
