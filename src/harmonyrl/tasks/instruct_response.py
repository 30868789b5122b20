"""What counts as a response in the instruct env: enough words, enough distinct ones, the topic named, and the
prompt's own lines not counted (an empty or echoed answer met every constraint of some tasks before; see
:mod:`harmonyrl.tasks.instruct`'s docstring)."""

from __future__ import annotations

from harmonyrl.tasks.constraints import words

GENERIC_TOPIC = "the subject"
"""The topic of a hand-written request (a task file), whose wording is free text: no topic words are required."""
MIN_WORDS = 8
"""A response shorter than this (in :func:`~harmonyrl.tasks.constraints.words`) is no response: it scores 0."""
MIN_DISTINCT_WORDS = 5
"""...and so is one that repeats fewer different words (``sea sea sea sea sea sea sea sea``)."""
_FUNCTION_WORDS = frozenset({"a", "an", "the", "at", "of", "in", "on", "to", "for", "and", "my", "your"})


def topic_words(topic: str) -> tuple[str, ...]:
    """The words of a generated topic an answer must mention ("a city at night" → city, night); none for the
    generic topic of a hand-written request, whose wording is free text."""
    if topic == GENERIC_TOPIC:
        return ()
    return tuple(w for w in words(topic.lower()) if w not in _FUNCTION_WORDS)


def is_response(text: str, topic: str, prompt: str = "") -> bool:
    """Whether ``text`` is a response at all (see "What counts as a response" in the module docstring).

    Runs of words that copy a whole line of ``prompt`` (the request or a constraint) are left out first:
    echoing the instructions is not writing about the topic.
    """
    lines = [[w.lower() for w in words(line)] for line in prompt.split("\n")]
    seen = _without([w.lower() for w in words(text)], [line for line in lines if line])
    distinct = set(seen)
    return len(seen) >= MIN_WORDS and len(distinct) >= MIN_DISTINCT_WORDS and distinct.issuperset(topic_words(topic))


def _without(seq: list[str], runs: list[list[str]]) -> list[str]:
    """``seq`` minus every occurrence of any of ``runs`` (left to right, first run that matches)."""
    out: list[str] = []
    i = 0
    while i < len(seq):
        run = next((r for r in runs if seq[i : i + len(r)] == r), None)
        if run is None:
            out.append(seq[i])
        i += len(run) if run else 1
    return out
