"""The instruct env's scripted writer: a compliant response to a set of constraints, or one that breaks exactly the
constraint asked for (the imperfect expert's demonstrations, and the reference answer of every generated task)."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence

from harmonyrl.tasks.constraints import Constraint, Kind, words
from harmonyrl.tasks.instruct_response import is_response

FILLER = ("{T} can change how a day feels.", "Many people have a story about {t}.", "I often think about {t}.",
          "There is always more to see in {t}.", "The small details of {t} are easy to miss.",
          "Some moments with {t} stay for years.", "It is worth taking time for {t}.", "I like it.",
          "It feels calm.", "Time passes slowly here.")  # fmt: skip
END_PHRASES = ("Is there anything else I can help with?", "That is all.", "Thank you for reading.",
               "Let me know what you think.")  # fmt: skip


class WriterError(ValueError):
    """The writer found no response meeting every constraint (bounds too tight for the shape asked for)."""


# ---- the writer: a compliant response, or one that breaks exactly the constraint asked for -----------


def _groups(sentences: list[str], n: int) -> list[list[str]]:
    size, extra = divmod(len(sentences), n)
    bounds = [g * size + min(g, extra) for g in range(n + 1)]  # the first ``extra`` groups get one more
    return [sentences[bounds[g] : bounds[g + 1]] for g in range(n)]


def _render(sentences: list[str], by: dict[Kind, Constraint], n_groups: int, start: str | None) -> str:
    if start is not None and sentences:
        first = sentences[0]
        keep = first.startswith("I ") or first in END_PHRASES  # an exact ending keeps its capital
        sentences = [f"{start} {first if keep else first[0].lower() + first[1:]}", *sentences[1:]]
    groups = [" ".join(g) for g in _groups(sentences, n_groups)]
    if "bullets" in by:
        return "\n".join(f"* {g}" for g in groups)
    return "\n***\n".join(groups)


def write(constraints: Sequence[Constraint], topic: str, rng: random.Random, broken: Kind | None = None) -> str:
    """A response meeting ``constraints`` (all of them, or all but ``broken``, which it violates on purpose).

    Sentences are topical filler; the word bounds are met by adding sentences (shortest first when tight),
    the shape (bullets, paragraphs) by spreading them over groups, then exact start / end, wrapping and case.
    Raises :class:`WriterError` when it finds none (e.g. bounds too tight for the shape, a forbidden "it").
    """
    by = {c.kind: c for c in constraints}
    lo = by["min_words"].n if "min_words" in by else 8
    hi = by["max_words"].n if "max_words" in by else max(lo + 30, 40)
    shape = by.get("bullets") or by.get("paragraphs")
    n_groups = shape.n if shape else 1
    keywords = list(by["include_keywords"].words) if "include_keywords" in by else []
    start = by["start_with"].words[0] if "start_with" in by else None
    match broken:
        case "min_words":  # a too-short reply: one block, no keyword sentence (it misses more than length)
            lo, hi, n_groups, keywords = 1, by["min_words"].n - 1, 1, []
        case "max_words":
            lo, hi = by["max_words"].n + 5, by["max_words"].n + 60
        case "bullets" | "paragraphs":
            n_groups = n_groups + 1 if broken == "bullets" or n_groups == 1 else n_groups - 1
        case "include_keywords":
            keywords.pop()
    head = [f"It brings to mind {' and '.join(keywords)}."] if keywords else []
    if broken == "forbid_word":
        head.append(f"The word {by['forbid_word'].words[0]} fits here.")
    tail = [by["end_with"].phrase] if "end_with" in by else []
    t = topic
    fillers = [f.format(t=t, T=t[0].upper() + t[1:]) for f in FILLER]
    rng.shuffle(fillers)
    topical = next(i for i, f in enumerate(fillers) if t.lower() in f.lower())
    fillers.insert(0, fillers.pop(topical))  # the first sentence names the topic (see is_response)
    if "forbid_word" in by and broken != "forbid_word":  # a task file may forbid a filler word ("the")
        fillers = [f for f in fillers if by["forbid_word"].holds(f)]
    for pool in (fillers * 2, sorted(fillers, key=lambda s: len(words(s))) * 2):  # repeats only when breaking
        body: list[str] = []
        while True:
            sentences = head + body + tail
            text = _finish(_render(sentences, by, n_groups, start), by, broken)
            count = len(words(text))
            enough = count >= lo and len(sentences) >= n_groups and (body or broken == "min_words")
            if enough or len(body) == len(pool):
                break
            body.append(pool[len(body)])
        ok = lo <= count <= hi and len(sentences) >= n_groups
        if ok and (broken is not None or (is_response(text, topic) and all(c.holds(text) for c in constraints))):
            return text
    raise WriterError(
        f"the built-in writer found no response of {lo}..{hi} words meeting {[c.phrase_line for c in constraints]}"
    )


def _finish(text: str, by: dict[Kind, Constraint], broken: Kind | None) -> str:
    """Exact start / end fixes, wrapping and case, then the deliberate break of the last-applied kinds."""
    if broken == "end_with":
        text += " Thanks again."
    if broken == "start_with":
        text = f"Well {text}"
    if "json" in by:
        text = json.dumps({"response": text})
    if "quoted" in by:
        text = f'"{text}"'
    if "lowercase" in by:
        text = text.lower()
    if "uppercase" in by:
        text = text.upper()
    match broken:
        case "no_commas":
            text = re.sub(r"(?<=[A-Za-z]) ", ", ", text, count=1)
        case "lowercase":
            text = re.sub(r"[a-z]", lambda m: m.group(0).upper(), text, count=1)
        case "uppercase":
            text = re.sub(r"[A-Z]+(?=[^A-Z]*$)", lambda m: m.group(0).lower(), text, count=1)
        case "json":
            text = f"Here you go: {text}"
        case "quoted":
            text = text[:-1]
    return text
