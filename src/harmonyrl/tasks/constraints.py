"""Verifiable writing constraints for the ``instruct`` env: what each kind says, how it is checked, how it parses.

    c = Constraint("max_words", n=40)
    c.phrase                       # 'Use at most 40 words.'   (one line of the prompt)
    c.holds("a short reply")       # True
    parse_line(c.phrase) == c      # the prompt line is the constraint's only serialisation

Checkers are small pure functions of the response text, deliberately literal so a user can predict them:

* a *word* is a run of letters/digits (an apostrophe inside is kept: "don't" is one word); markup such as
  ``*``, ``***``, quotes and JSON braces is not a word, the JSON key of a wrapped response is;
* ``include_keywords`` / ``forbid_word`` match whole words, case-insensitively ("things" does not contain
  "thing"); ``start_with`` compares the first word case-insensitively; ``end_with`` is exact (case included);
* a bullet is a line starting with ``* `` (after indentation); paragraphs are the non-empty parts between
  ``***`` separators; ``json`` means the stripped response parses as JSON, ``quoted`` that it starts and ends
  with a double quote.

We wrote our own checkers rather than use the PyPI ``if-verifiable`` package: it depends on ``nltk`` (whose
tokenizer data is a download this machine cannot make), ``datasets`` and ``langdetect``, and its IFEval
checkers carry options (languages, sentence counts via punkt) that our templates do not need.

Some kinds exclude each other (all caps and all lowercase; a JSON response has no bullets; an exact ending
cannot be followed by a closing quote...): :data:`CONFLICTS` lists them, and :func:`validate` reports a
conflicting set as one line, so a hand-written task file fails loudly instead of holding an impossible task.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

Kind = Literal[
    "min_words",
    "max_words",
    "include_keywords",
    "forbid_word",
    "no_commas",
    "lowercase",
    "uppercase",
    "bullets",
    "paragraphs",
    "end_with",
    "start_with",
    "json",
    "quoted",
]
KINDS: tuple[Kind, ...] = get_args(Kind)
_WORD = re.compile(r"[A-Za-z0-9]+(?:'[A-Za-z0-9]+)*")
_BULLET = re.compile(r"^[ \t]*\* ", re.MULTILINE)
_SEPARATOR = re.compile(r"\s*\*\*\*\s*")
_SHAPES = ("json", "quoted", "bullets", "paragraphs")
CONFLICTS: frozenset[frozenset[str]] = frozenset(
    {frozenset(p) for p in (("lowercase", "uppercase"), ("end_with", "lowercase"), ("end_with", "uppercase"),
                            ("json", "start_with"), ("json", "end_with"), ("quoted", "end_with"))}
    | {frozenset((a, b)) for a in _SHAPES for b in _SHAPES if a != b}
)  # fmt: skip
"""Pairs of kinds a task may not combine (at most one "shape": json, quoted, bullets or paragraphs)."""
MAX_TEXT = 200
"""Longest string argument (a keyword, a phrase)."""


def words(text: str) -> list[str]:
    return _WORD.findall(text)


def _has_word(text: str, word: str) -> bool:
    return re.search(rf"(?<![A-Za-z0-9']){re.escape(word)}(?![A-Za-z0-9'])", text, re.IGNORECASE) is not None


def _is_json(text: str) -> bool:
    try:
        json.loads(text.strip())
    except ValueError:
        return False
    return True


def _paragraphs(text: str) -> list[str]:
    return _SEPARATOR.split(text.strip())


@dataclass(frozen=True)
class Constraint:
    """One constraint. Which argument a kind uses: ``n`` (min_words, max_words, bullets, paragraphs),
    ``words`` (include_keywords: 1-3 words; forbid_word and start_with: exactly one), ``phrase`` (end_with)."""

    kind: Kind
    n: int = 0
    words: tuple[str, ...] = ()
    phrase: str = ""

    @property
    def phrase_line(self) -> str:
        """The prompt line that states this constraint (and that :func:`parse_line` reads back)."""
        quoted = " and ".join(f'"{w}"' for w in self.words)
        return {
            "min_words": f"Use at least {self.n} words.",
            "max_words": f"Use at most {self.n} words.",
            "include_keywords": f"Include the word{'s' if len(self.words) > 1 else ''} {quoted}.",
            "forbid_word": f"Do not use the word {quoted}.",
            "no_commas": "Do not use any commas.",
            "lowercase": "Write everything in lowercase letters.",
            "uppercase": "Write everything in capital letters.",
            "bullets": f'Use exactly {self.n} bullet points, each on its own line starting with "* ".',
            "paragraphs": f'Write exactly {self.n} paragraphs separated by the line "***".',
            "end_with": f'End your response with the exact phrase "{self.phrase}".',
            "start_with": f"Start your response with the word {quoted}.",
            "json": "Wrap the whole response in JSON.",
            "quoted": "Wrap the whole response in double quotes.",
        }[self.kind]

    def holds(self, text: str) -> bool:
        """Whether ``text`` (the final message) satisfies this constraint."""
        return CHECKS[self.kind](self, text)

    def as_json(self) -> dict[str, object]:
        """``{"kind": ..., "args": {...}}``, the task-file form (see :func:`from_json`)."""
        args: dict[str, object] = {}
        if self.kind in _N_KINDS:
            args["n"] = self.n
        elif self.kind == "include_keywords":
            args["words"] = list(self.words)
        elif self.kind in ("forbid_word", "start_with"):
            args["word"] = self.words[0]
        elif self.kind == "end_with":
            args["phrase"] = self.phrase
        return {"kind": self.kind, "args": args}


CHECKS: dict[Kind, Callable[[Constraint, str], bool]] = {
    "min_words": lambda c, t: len(words(t)) >= c.n,
    "max_words": lambda c, t: len(words(t)) <= c.n,
    "include_keywords": lambda c, t: all(_has_word(t, w) for w in c.words),
    "forbid_word": lambda c, t: not _has_word(t, c.words[0]),
    "no_commas": lambda c, t: "," not in t,
    "lowercase": lambda c, t: bool(t.strip()) and t == t.lower(),
    "uppercase": lambda c, t: any(ch.isalpha() for ch in t) and t == t.upper(),
    "bullets": lambda c, t: len(_BULLET.findall(t)) == c.n,
    "paragraphs": lambda c, t: len(ps := _paragraphs(t)) == c.n and all(ps),
    "end_with": lambda c, t: t.strip().endswith(c.phrase),
    "start_with": lambda c, t: bool(ws := words(t)) and ws[0].lower() == c.words[0].lower(),
    "json": lambda c, t: _is_json(t),
    "quoted": lambda c, t: len(s := t.strip()) >= 2 and s[0] == s[-1] == '"',
}
_N_KINDS = frozenset({"min_words", "max_words", "bullets", "paragraphs"})
_N_RANGE = {"min_words": (1, 500), "max_words": (1, 500), "bullets": (1, 12), "paragraphs": (1, 8)}

# ---- prompt lines back to constraints ----------------------------------------------------------------

_Q = r'"([^"\n]+)"'
_LINE_PATTERNS: tuple[tuple[str, Kind], ...] = (
    (r"Use at least (\d+) words\.", "min_words"),
    (r"Use at most (\d+) words\.", "max_words"),
    (rf"Include the words? ({_Q}(?: and {_Q})*)\.", "include_keywords"),
    (rf"Do not use the word {_Q}\.", "forbid_word"),
    (r"Do not use any commas\.", "no_commas"),
    (r"Write everything in lowercase letters\.", "lowercase"),
    (r"Write everything in capital letters\.", "uppercase"),
    (r'Use exactly (\d+) bullet points, each on its own line starting with "\* "\.', "bullets"),
    (r'Write exactly (\d+) paragraphs separated by the line "\*\*\*"\.', "paragraphs"),
    (rf"End your response with the exact phrase {_Q}\.", "end_with"),
    (rf"Start your response with the word {_Q}\.", "start_with"),
    (r"Wrap the whole response in JSON\.", "json"),
    (r"Wrap the whole response in double quotes\.", "quoted"),
)
_LINES = tuple((re.compile(p), k) for p, k in _LINE_PATTERNS)


def parse_line(line: str) -> Constraint | None:
    """The constraint a prompt line states, or None if the line is not a constraint line."""
    for pattern, kind in _LINES:
        if m := pattern.fullmatch(line):
            if kind in _N_KINDS:
                return Constraint(kind, n=int(m.group(1)))
            if kind == "include_keywords":
                return Constraint(kind, words=tuple(re.findall(r'"([^"\n]+)"', m.group(1))))
            if kind in ("forbid_word", "start_with"):
                return Constraint(kind, words=(m.group(1),))
            if kind == "end_with":
                return Constraint(kind, phrase=m.group(1))
            return Constraint(kind)
    return None


# ---- validation (task files) -------------------------------------------------------------------------


def _text_arg(kind: str, name: str, value: object, one_word: bool) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_TEXT:
        raise ValueError(f"{kind}: '{name}' must be a non-empty string of at most {MAX_TEXT} characters")
    if '"' in value or "\n" in value or value != value.strip():
        raise ValueError(f"{kind}: '{name}' may not contain double quotes, newlines or outer spaces: {value!r}")
    if one_word and words(value) != [value]:
        raise ValueError(f"{kind}: '{name}' must be one word (letters and digits), got {value!r}")
    return value


def from_json(row: object) -> Constraint:
    """``{"kind": "max_words", "args": {"n": 40}}`` → Constraint; ``ValueError`` (one line) on anything else.

    ``args`` per kind: ``{"n": int}`` for min_words / max_words / bullets / paragraphs; ``{"words": [1-3
    words]}`` for include_keywords; ``{"word": str}`` for forbid_word / start_with; ``{"phrase": str}`` for
    end_with; ``{}`` (or no ``args``) for the rest.
    """
    if not isinstance(row, dict) or set(row) - {"kind", "args"} or "kind" not in row:
        raise ValueError(f'a constraint is {{"kind": ..., "args": {{...}}}}, got {json.dumps(row)[:120]}')
    kind, args = row["kind"], row.get("args", {})
    if kind not in KINDS:
        raise ValueError(f"unknown constraint kind {kind!r}; known: {', '.join(KINDS)}")
    expected = {"include_keywords": {"words"}, "forbid_word": {"word"}, "start_with": {"word"},
                "end_with": {"phrase"}}.get(kind, {"n"} if kind in _N_KINDS else set())  # fmt: skip
    if not isinstance(args, dict) or set(args) != expected:
        raise ValueError(f"{kind}: 'args' must have exactly the key(s) {sorted(expected)}, got {args!r}"[:200])
    if kind in _N_KINDS:
        lo, hi = _N_RANGE[kind]
        n = args["n"]
        if not isinstance(n, int) or isinstance(n, bool) or not lo <= n <= hi:
            raise ValueError(f"{kind}: 'n' must be an integer in [{lo}, {hi}], got {n!r}")
        return Constraint(kind, n=n)
    if kind == "include_keywords":
        ws = args["words"]
        if not isinstance(ws, list) or not 1 <= len(ws) <= 3:
            raise ValueError(f"{kind}: 'words' must be a list of 1 to 3 words, got {ws!r}"[:200])
        return Constraint(kind, words=tuple(_text_arg(kind, "words", w, True) for w in ws))
    if kind in ("forbid_word", "start_with"):
        return Constraint(kind, words=(_text_arg(kind, "word", args["word"], True),))
    if kind == "end_with":
        return Constraint(kind, phrase=_text_arg(kind, "phrase", args["phrase"], False))
    return Constraint(kind)


def validate(constraints: Sequence[Constraint]) -> None:
    """Reject sets no response can satisfy by construction: duplicates, conflicting kinds, crossed bounds."""
    if not constraints:
        raise ValueError("a task needs at least one constraint")
    kinds = [c.kind for c in constraints]
    if dupes := sorted({k for k in kinds if kinds.count(k) > 1}):
        raise ValueError(f"constraint kind(s) {dupes} given more than once")
    for pair in CONFLICTS:
        if pair <= set(kinds):
            raise ValueError(f"constraints {' and '.join(sorted(pair))} cannot both hold")
    by = {c.kind: c for c in constraints}
    if "min_words" in by and "max_words" in by and by["min_words"].n > by["max_words"].n:
        raise ValueError(f"min_words {by['min_words'].n} is above max_words {by['max_words'].n}")
    if "forbid_word" in by:
        banned = by["forbid_word"].words[0].lower()
        required = [w.lower() for k in ("include_keywords", "start_with") if k in by for w in by[k].words]
        if banned in required or ("end_with" in by and _has_word(by["end_with"].phrase, banned)):
            raise ValueError(f"the forbidden word {banned!r} is also required")
    if "no_commas" in by and "end_with" in by and "," in by["end_with"].phrase:
        raise ValueError("the end_with phrase contains a comma, which no_commas forbids")
