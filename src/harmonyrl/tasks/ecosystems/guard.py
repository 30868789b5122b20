"""What a foreign grader's score must get past before it counts (invariant 9: the policy is an adversary).

A grader written for evaluation, not for optimisation against it, can pay for answers that say nothing:
reasoning-gym's default ``score_answer`` pays ``len(reference) / len(answer)`` for any answer that contains the
reference, so pasting the question back with every plausible number in it earns a little, and its
``power_function`` scores an empty answer 0.01. RL finds such payments. So, before the package's own grader is
asked, an answer scores 0 if it is

* empty (or only whitespace);
* over-long: more than ``max_chars`` characters (by default :func:`default_max_chars` of the reference answer,
  four times it plus 16 — room for a verbose but honest answer, not for a list of candidates);
* an echo: it contains the question itself (whitespace and case aside).

The grader's own verdict on everything else stands; a grader that raises on an answer scores it 0 (the answer
caused it: masking it would hand RL a way out of a 0).
"""

from __future__ import annotations

from typing import Literal

Verdict = Literal["ok", "empty", "over_long", "echo"]


def default_max_chars(reference: str) -> int:
    """The longest answer scored when none is configured: four times the reference answer plus 16 characters."""
    return 4 * len(reference) + 16


def _normal(text: str) -> str:
    return " ".join(text.split()).casefold()


def check_answer(answer: str, question: str, reference: str, max_chars: int | None = None) -> Verdict:
    """``"ok"`` if the answer may be graded, else why it scores 0 without grading (module docstring)."""
    if not answer.strip():
        return "empty"
    limit = default_max_chars(reference) if max_chars is None else max_chars
    if len(answer) > limit:
        return "over_long"
    q = _normal(question)
    if q and q in _normal(answer):
        return "echo"
    return "ok"
