"""The held-out evaluation reports its success rates' standard errors, clustered by task (telemetry/stats.py)."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Sequence

import pytest

from fakes import ScriptedEngine
from harmonyrl.harmony.render import render_completion
from harmonyrl.harmony.tokenizer import HarmonyTokenizer
from harmonyrl.rollout.agent_loop import EpisodeLimits
from harmonyrl.run.evaluate import evaluate
from harmonyrl.tasks.calculator import CalculatorFactory, expression_of
from harmonyrl.types import Message

TOK = HarmonyTokenizer.load_default()
FACTORY = CalculatorFactory(seed=0, n_train=4, n_test=4)
TASKS = list(FACTORY.tasks("test"))


def half_solver() -> ScriptedEngine:
    """Solves the even-numbered tasks with the tool; answers the odd ones "0" at once (wrong)."""

    def script(prompt: Sequence[int]) -> list[int]:
        text = TOK.decode(list(prompt))
        i, task = next((i, t) for i, t in enumerate(TASKS) if t.prompt in text)
        if i % 2 or "<|call|>" in text:
            return render_completion(TOK, [Message("assistant", "0" if i % 2 else task.answer, "final")])
        args = json.dumps({"expression": expression_of(task)})
        return render_completion(TOK, [Message("assistant", args, "commentary", "functions.calculator",
                                                content_type="json")])  # fmt: skip

    return ScriptedEngine(script)


def test_success_se_is_clustered_by_task() -> None:
    limits = EpisodeLimits(max_turns=4, max_new_tokens=64, max_seq_len=512, timeout_s=None)
    metrics = asyncio.run(evaluate(half_solver(), FACTORY, TOK, TASKS, limits, 1.0, 3, seed=0))  # type: ignore[arg-type]
    assert metrics["eval/success"] == pytest.approx(0.5)
    # task means 1, 0, 1, 0 (each task's 3 samples agree): SE = sd(1, 0, 1, 0) / 2, not the 12-sample binomial
    assert metrics["eval/success_se"] == pytest.approx(math.sqrt(1 / 3) / 2)
    assert metrics["eval/success_se"] > math.sqrt(0.25 / 12)
    assert metrics["eval_greedy/success_se"] == pytest.approx(math.sqrt(1 / 3) / 2)  # one episode per task
