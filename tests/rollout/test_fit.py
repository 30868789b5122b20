"""Prompts that leave no room under ``rollout.max_seq_len`` are reported before any compute is spent."""

from __future__ import annotations

import asyncio
import io

from rich.console import Console

from harmonyrl.config import load_config
from harmonyrl.harmony.tokenizer import HarmonyTokenizer
from harmonyrl.rollout.fit import PromptFit, prompt_lengths, warn_if_prompts_do_not_fit
from harmonyrl.run.setup import make_factory
from harmonyrl.tasks.calculator import CalculatorEnv, CalculatorFactory
from harmonyrl.types import Message, Task

TOK = HarmonyTokenizer.load_default()


def test_prompts_are_classified_by_the_room_they_leave() -> None:
    # budget 100, turn 10: rooms 60, 10 (a full turn), 9 (short), 1 (short), 0 and -20 (none)
    fit = PromptFit((40, 90, 91, 99, 100, 120), max_seq_len=100, max_new_tokens=10)
    assert (fit.no_room, fit.short_room) == (2, 2)
    assert fit.warning() == (
        "4 of 6 checked prompts (longest 120 tokens) leave less than max_new_tokens=10 of rollout.max_seq_len=100 "
        "(2 leave none): those episodes end truncated whatever the model does; try rollout.max_seq_len=256"
    )
    assert PromptFit((40, 90), 100, 10).warning() is None
    assert PromptFit((), 100, 10).warning() is None


def test_lengths_are_the_agent_loops_rendering() -> None:
    factory = CalculatorFactory(seed=0, n_train=4, n_test=2)
    lengths = asyncio.run(prompt_lengths(factory, TOK, factory.tasks("train")))
    assert len(lengths) == 4 and all(100 < n < 400 for n in lengths)
    longest = max(lengths)
    assert PromptFit(tuple(lengths), longest + 64, 64).warning() is None
    warning = PromptFit(tuple(lengths), longest, 64).warning()
    assert warning is not None and f"longest {longest} tokens" in warning and "leave none" in warning


def test_an_env_that_fails_to_reset_is_left_out_not_raised() -> None:
    class Flaky(CalculatorFactory):
        def make(self, task: Task) -> CalculatorEnv:
            env = super().make(task)
            if task.id == self.tasks("train")[1].id:

                async def reset() -> list[Message]:
                    raise ConnectionError("backend down")

                env.reset = reset  # type: ignore[method-assign]
            return env

    factory = Flaky(seed=0, n_train=4, n_test=2)
    full = asyncio.run(prompt_lengths(CalculatorFactory(seed=0, n_train=4, n_test=2), TOK, factory.tasks("train")))
    assert asyncio.run(prompt_lengths(factory, TOK, factory.tasks("train"))) == full[:1] + full[2:]


def test_train_and_eval_print_the_warning_for_an_env_that_does_not_fit() -> None:
    def printed(overrides: list[str]) -> str:
        out = io.StringIO()
        config = load_config(None, overrides)
        r = config.rollout
        console = Console(file=out, width=400, color_system=None)
        asyncio.run(warn_if_prompts_do_not_fit(make_factory(config), TOK, r.max_seq_len, r.max_new_tokens, console))
        return out.getvalue()

    small = printed(["env.name=browse"])
    assert small.startswith("warning: env browse: ") and "try rollout.max_seq_len=" in small
    assert printed(["env.name=browse", "rollout.max_seq_len=2048"]) == ""
    assert printed([]) == ""  # the default run fits
