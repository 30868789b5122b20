"""The imperfect scripted experts' shared habits: plausible wrong guesses and chatty answers the graders reject."""

from __future__ import annotations

import random


def guess_answer(answer: int, rng: random.Random) -> str:
    """A plausible mental-arithmetic answer: right magnitude, wrong digits (or rounded)."""
    digits = list(str(abs(answer)))
    if rng.random() < 0.3 and len(digits) > 2:
        guess = round(abs(answer), -rng.choice((1, 2)))
    else:
        for i in rng.sample(range(len(digits)), k=min(len(digits), rng.choice((1, 2)))):
            lowest = 1 if i == 0 and len(digits) > 1 else 0  # keep the leading digit non-zero
            digits[i] = rng.choice([d for d in "0123456789"[lowest:] if d != digits[i]])
        guess = int("".join(digits))
    return str(-guess if answer < 0 else guess)


VERBOSE_TEMPLATES = ("The answer is {}.", "The result is {}.", "{} is the answer.")
"""What a chatty expert writes instead of "only the number": the instructions forbid it, the grader rejects it."""
