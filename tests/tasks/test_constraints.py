"""Instruct constraints: each checker on texts that pass and fail, prompt lines round-trip, task-file validation."""

from __future__ import annotations

import pytest

from harmonyrl.tasks.constraints import KINDS, Constraint, from_json, parse_line, validate, words

C = Constraint
CASES: list[tuple[Constraint, str, str]] = [  # (constraint, a text that satisfies it, one that does not)
    (C("min_words", n=3), "one two three", "one two"),
    (C("max_words", n=3), "* one two *** three", "one two three four"),
    (C("include_keywords", words=("river", "Gold")), "The RIVER was gold.", "The river was golden."),
    (C("forbid_word", words=("thing",)), "Many things happen.", "One Thing happens."),
    (C("no_commas"), "No commas here.", "One, two."),
    (C("lowercase"), "all lower 123.", "Not lower."),
    (C("uppercase"), "ALL UPPER 123!", "ALL UPPEr"),
    (C("bullets", n=2), "* one\n  * two\nnot a bullet", "* one\n*two\n- three"),
    (C("paragraphs", n=2), "first part\n***\nsecond part", "first\n***\n***\nthird"),
    (C("end_with", phrase="That is all."), "Done. That is all.  \n", "Done. That is all"),
    (C("start_with", words=("Today",)), '"today we talk', "Well today we talk"),
    (C("json"), ' {"response": "hi"}\n', 'Here: {"response": "hi"}'),
    (C("quoted"), ' "a quoted reply" ', '"not closed'),
]


def test_cases_cover_every_kind() -> None:
    assert sorted(c.kind for c, _, _ in CASES) == sorted(KINDS) and len(KINDS) == 13


@pytest.mark.parametrize(("constraint", "good", "bad"), CASES, ids=[c.kind for c, _, _ in CASES])
def test_checker_accepts_and_rejects(constraint: Constraint, good: str, bad: str) -> None:
    assert constraint.holds(good) is True
    assert constraint.holds(bad) is False
    assert parse_line(constraint.phrase_line) == constraint
    assert from_json(constraint.as_json()) == constraint


def test_words_and_edge_cases() -> None:
    assert words("don't stop: *** 3 {\"k\": 'v'}") == ["don't", "stop", "3", "k", "v"]
    assert not C("lowercase").holds("   ") and not C("uppercase").holds("123")
    assert not C("paragraphs", n=1).holds("") and C("paragraphs", n=1).holds("one block")
    assert not C("start_with", words=("Hi",)).holds("*** ")
    assert C("include_keywords", words=("a",)).phrase_line == 'Include the word "a".'
    assert parse_line('Include the words "a" and "b" and "c".') == C("include_keywords", words=("a", "b", "c"))
    assert parse_line("Use at least ten words.") is None


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"kind": "shout"}, "unknown constraint kind 'shout'"),
        ({"kind": "max_words", "args": {"m": 3}}, "must have exactly the key(s) ['n']"),
        ({"kind": "max_words", "args": {"n": 0}}, "'n' must be an integer in [1, 500], got 0"),
        ({"kind": "bullets", "args": {"n": True}}, "'n' must be an integer in [1, 12], got True"),
        ({"kind": "include_keywords", "args": {"words": []}}, "list of 1 to 3 words"),
        ({"kind": "forbid_word", "args": {"word": "two words"}}, "must be one word"),
        ({"kind": "end_with", "args": {"phrase": 'say "hi"'}}, "may not contain double quotes"),
        ({"kind": "no_commas", "args": {"x": 1}}, "must have exactly the key(s) []"),
        ({"kind": "json", "extra": 1}, 'a constraint is {"kind": ..., "args": {...}}'),
        ("no_commas", 'a constraint is {"kind"'),
    ],
)
def test_from_json_errors_are_one_line(row: object, message: str) -> None:
    with pytest.raises(ValueError) as e:
        from_json(row)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("constraints", "message"),
    [
        ([], "at least one constraint"),
        ([C("no_commas"), C("no_commas")], "['no_commas'] given more than once"),
        ([C("lowercase"), C("uppercase")], "lowercase and uppercase cannot both hold"),
        ([C("json"), C("bullets", n=2)], "bullets and json cannot both hold"),
        ([C("min_words", n=50), C("max_words", n=40)], "min_words 50 is above max_words 40"),
        ([C("forbid_word", words=("sea",)), C("include_keywords", words=("Sea",))], "'sea' is also required"),
        ([C("no_commas"), C("end_with", phrase="Bye, now.")], "contains a comma"),
    ],
)
def test_validate_rejects_impossible_sets(constraints: list[Constraint], message: str) -> None:
    with pytest.raises(ValueError, match=None) as e:
        validate(constraints)
    assert message in str(e.value)
