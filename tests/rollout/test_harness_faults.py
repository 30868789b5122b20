"""Invariant 8: only the environment's own calls produce environment faults; a harness exception is loud.

An engine that raises on its k-th ``generate``, or a parser that raises, must fail the rollout with that very
exception (not become a masked ``env_error``); an env whose ``make``/``reset``/``step`` raises is masked exactly
as before. The engine is scripted: every episode calls the calculator once, then answers correctly.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence

import pytest
import torch

import harmonyrl.rollout.agent_loop as agent_loop
from harmonyrl.harmony.render import render_completion
from harmonyrl.harmony.tokenizer import HarmonyTokenizer
from harmonyrl.rollout.agent_loop import EpisodeLimits
from harmonyrl.rollout.scheduler import EpisodeRequest, RolloutResult, run_episodes
from harmonyrl.tasks.calculator import CalculatorEnv, CalculatorFactory, expression_of
from harmonyrl.types import Generation, Message, SamplingParams, StepResult, Task

TOK = HarmonyTokenizer.load_default()
TASKS = CalculatorFactory(seed=0, n_train=20, n_test=1).tasks("train")
PARAMS = SamplingParams(stop_ids=TOK.special.stop_ids)


class EngineBroke(RuntimeError):
    """The fake engine's failure (a type no environment raises)."""


class CountingEngine:
    """Calls the calculator, then answers correctly; raises on its ``fail_on``-th generate (1-based)."""

    def __init__(self, fail_on: int | None = None, exc: BaseException | None = None) -> None:
        self.calls = 0
        self.policy_version = 0
        self.fail_on = fail_on
        self.exc = exc or EngineBroke("decode step crashed")

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        self.calls += 1
        call = self.calls
        await asyncio.sleep(0)  # let the other episodes interleave, as a real engine does
        if call == self.fail_on:
            raise self.exc
        text = TOK.decode(prompt_ids)
        task = next(t for t in TASKS if t.prompt in text)
        if "<|call|>" in text:
            ids = render_completion(TOK, [Message("assistant", task.answer, "final")])
        else:
            call = json.dumps({"expression": expression_of(task)})
            msg = Message("assistant", call, "commentary", recipient="functions.calculator", content_type="json")
            ids = render_completion(TOK, [msg])
        return Generation(tuple(ids), tuple([-0.5] * len(ids)), "stop")

    async def sync_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None: ...

    def metrics_window(self) -> None:
        return None

    async def close(self) -> None: ...


class TrackingFactory(CalculatorFactory):
    """Calculator envs that record their closes; ``broken`` names an env call that raises."""

    def __init__(self, broken: str | None = None) -> None:
        super().__init__(seed=0, n_train=20, n_test=1)
        self.broken = broken
        self.made = self.closed = 0

    def make(self, task: Task) -> CalculatorEnv:
        if self.broken == "make":
            raise OSError("no database")
        env = super().make(task)
        self.made += 1
        close = env.close

        async def closing() -> None:
            self.closed += 1
            await close()

        async def boom(*_: object) -> StepResult:
            raise KeyError("tool table")

        env.close = closing  # type: ignore[method-assign]
        if self.broken in ("reset", "step"):
            setattr(env, self.broken, boom)
        return env


def rollout(factory: TrackingFactory, engine: CountingEngine, n: int = 6, budget: float | None = 30.0) -> RolloutResult:
    reqs = [EpisodeRequest(TASKS[i], i, i) for i in range(n)]
    limits = EpisodeLimits(max_turns=4, max_new_tokens=64, max_seq_len=512, timeout_s=budget)
    return asyncio.run(run_episodes(engine, factory, TOK, reqs, PARAMS, limits, 8))  # type: ignore[arg-type]


def test_healthy_rollout_for_reference() -> None:
    factory = TrackingFactory()
    out = rollout(factory, CountingEngine())
    assert [t.failure for t in out.trajectories] == [None] * 6 and [t.reward for t in out.trajectories] == [1.0] * 6
    assert factory.made == factory.closed == 6


@pytest.mark.parametrize("k", [1, 4, 9])  # the first generate, one mid-way, one in the second turns
def test_an_engine_exception_mid_rollout_fails_the_rollout_instead_of_being_masked(k: int) -> None:
    factory = TrackingFactory()
    with pytest.raises(EngineBroke, match="decode step crashed") as info:
        rollout(factory, CountingEngine(fail_on=k))
    assert any("in the episode of task" in note for note in info.value.__notes__)  # which episode, for the log
    assert factory.closed == factory.made  # the other episodes were cancelled and their envs closed


def test_an_engine_timeout_error_is_not_taken_for_the_episode_budget() -> None:
    with pytest.raises(TimeoutError, match="engine rpc"):
        rollout(TrackingFactory(), CountingEngine(fail_on=2, exc=TimeoutError("engine rpc")), budget=30.0)


def test_a_parser_exception_fails_the_rollout(monkeypatch: pytest.MonkeyPatch) -> None:
    real = agent_loop.parse_completion
    seen: list[int] = []

    def parse(codec: object, ids: Sequence[int]) -> object:
        seen.append(1)
        if len(seen) == 3:
            raise IndexError("parser bug")
        return real(codec, ids)  # type: ignore[arg-type]

    monkeypatch.setattr(agent_loop, "parse_completion", parse)
    with pytest.raises(IndexError, match="parser bug"):
        rollout(TrackingFactory(), CountingEngine())


@pytest.mark.parametrize(
    ("broken", "detail"),
    [("make", "make: OSError: no database"), ("reset", "reset: KeyError: 'tool table'"),
     ("step", "step: KeyError: 'tool table'")],
)  # fmt: skip
def test_an_environment_call_that_raises_is_a_masked_env_error(broken: str, detail: str) -> None:
    out = rollout(TrackingFactory(broken), CountingEngine(), n=3)
    assert [(t.failure and t.failure.kind, t.failure and t.failure.detail) for t in out.trajectories] == [
        ("env_error", detail)
    ] * 3
    assert all(t.token_ids == () and t.reward == 0.0 for t in out.trajectories)  # masked, not scored 0 to train on
