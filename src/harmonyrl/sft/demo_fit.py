"""Do the demonstrations' assistant turns fit the rollout's turn budget (``rollout.max_new_tokens``)?

A warm start trains on whole demonstrated turns, but an RL or evaluation episode cuts every turn at
``max_new_tokens``: a demonstrated turn longer than that (a long SQL query, a whole program) is one the policy
can never write in an episode, so every task that needs it scores 0 whatever the policy learns. Found once in a
shipped preset (sql: the expert's query up to 162 tokens, a budget of 128), silently; now a warning at the start.
"""

from __future__ import annotations

from collections.abc import Sequence

from harmonyrl.sft.train import Demo


def turn_lengths(mask: Sequence[int]) -> list[int]:
    """Lengths of the runs of trained (mask 1) tokens of one rendered demonstration: its assistant turns, each
    with the stop token it ends with, as a rollout counts a turn's sampled tokens. ``[0,1,1,0,1] -> [2, 1]``."""
    runs: list[int] = []
    current = 0
    for m in mask:
        if m:
            current += 1
        elif current:
            runs.append(current)
            current = 0
    return [*runs, current] if current else runs


def turn_budget_note(demos: Sequence[Demo], max_new_tokens: int) -> str | None:
    """One line when any demonstrated turn is longer than ``max_new_tokens`` (how many demonstrations, the
    longest turn, the fix); None when every turn fits."""
    longest = [max(turn_lengths(d.mask), default=0) for d in demos]
    over = [n for n in longest if n > max_new_tokens]
    if not over:
        return None
    return (
        f"{len(over)} of {len(demos)} demonstrations have an assistant turn longer than rollout.max_new_tokens="
        f"{max_new_tokens} (longest {max(over)} tokens): an episode cuts every turn there, so the policy can never "
        f"write those turns; raise rollout.max_new_tokens to at least {max(over)}"
    )
