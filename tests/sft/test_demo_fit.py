"""The warm start warns when a demonstrated assistant turn is longer than an episode's turn budget."""

from __future__ import annotations

import io

from rich.console import Console

from harmonyrl.sft.demo_fit import turn_budget_note, turn_lengths
from harmonyrl.sft.train import Demo
from harmonyrl.telemetry.progress import StepProgress


def test_turn_lengths_are_the_runs_of_trained_tokens() -> None:
    assert turn_lengths([0, 1, 1, 0, 1]) == [2, 1]
    assert turn_lengths([0, 0, 1, 1, 1]) == [3]
    assert turn_lengths([0, 0]) == []


def demo(*turns: int) -> Demo:
    mask: list[int] = [0, 0, 0]  # the prompt
    for n in turns:
        mask += [1] * n + [0, 0]  # a turn, then a tool result
    return Demo(tuple(range(len(mask))), tuple(mask))


def test_a_turn_over_the_budget_is_named_with_the_fix() -> None:
    demos = [demo(5, 3), demo(9, 2), demo(4), demo(12)]
    assert turn_budget_note(demos, 12) is None  # 12 fits exactly
    note = turn_budget_note(demos, 8)
    assert note is not None
    assert note.startswith("2 of 4 demonstrations have an assistant turn longer than rollout.max_new_tokens=8")
    assert "(longest 12 tokens)" in note and "raise rollout.max_new_tokens to at least 12" in note


def test_the_warning_is_one_plain_line_on_the_console() -> None:
    out = io.StringIO()
    StepProgress(Console(file=out, width=60)).warn("a [b] c")
    assert out.getvalue() == "warning: a [b] c\n"  # no markup read from it, not wrapped
