"""The shared test helpers (``tests/fakes.py``, ``tests/tiny_run.py``) do what the tests built on them assume."""

from __future__ import annotations

import asyncio

import pytest

from fakes import LOGPROB, ScriptedEngine
from harmonyrl.config import load_config
from harmonyrl.types import SamplingParams
from tiny_run import TINY_RUN, tiny_run


def test_scripted_engine_cuts_at_the_budget_and_says_why_it_stopped() -> None:
    engine = ScriptedEngine([[5, 6, 7], [5, 9]])
    params = SamplingParams(max_new_tokens=2, stop_ids=(9,))
    cut = asyncio.run(engine.generate([1], params))
    stopped = asyncio.run(engine.generate([1, 2], params))
    assert (cut.token_ids, cut.finish_reason, cut.logprobs) == ((5, 6), "length", (LOGPROB, LOGPROB))
    assert (stopped.token_ids, stopped.finish_reason) == ((5, 9), "stop")
    assert engine.prompts == [[1], [1, 2]]


def test_scripted_engine_follows_a_script_of_the_prompt() -> None:
    engine = ScriptedEngine(lambda prompt: [len(prompt), 9])
    params = SamplingParams(max_new_tokens=8, stop_ids=(9,))
    assert asyncio.run(engine.generate([1, 2, 3], params)).token_ids == (3, 9)


def test_tiny_run_replaces_keys_in_place_and_adds_new_ones() -> None:
    args = tiny_run("sft.steps=12", "threads=1")
    assert args[1] == "sft.steps=12" and args[-1] == "threads=1" and len(args) == len(TINY_RUN) + 1
    assert load_config(None, args).sft.steps == 12  # every key is a real config key
    with pytest.raises(ValueError, match="expected key=value"):
        tiny_run("threads")
