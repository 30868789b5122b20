"""The OpenEnv adapter against the real package (harmonyrl[openenv]) and an environment written as an OpenEnv user
would (examples/openenv_envs/guess_env, OpenEnv's template layout), its server started by the adapter on 127.0.0.1:
a whole episode through harmonyrl's agent loop, token-exact; the fault classes; the bad input refused in one line."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from fakes import ScriptedEngine
from harmonyrl.envs.checker import check_env, errors
from harmonyrl.envs.loader import UserCodeError
from harmonyrl.harmony.render import render_completion, render_training
from harmonyrl.harmony.tokenizer import HarmonyTokenizer
from harmonyrl.rollout.agent_loop import EpisodeLimits, initial_messages, run_episode
from harmonyrl.types import Message, SamplingParams, StepResult, Trajectory

pytest.importorskip("openenv.core", reason="openenv-core is not installed (pip install 'harmonyrl[openenv]')")

from harmonyrl.tasks.ecosystems.openenv import OpenEnvFactory

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "openenv_envs"
TOK = HarmonyTokenizer.load_default()
PARAMS = SamplingParams(stop_ids=TOK.special.stop_ids)
LIMITS = EpisodeLimits(max_turns=8, max_new_tokens=32, max_seq_len=1024)
CLIENT = "guess_env:GuessEnv"


@pytest.fixture(autouse=True, scope="module")
def examples_importable() -> Iterator[None]:
    sys.path.insert(0, str(EXAMPLES))
    yield
    sys.path.remove(str(EXAMPLES))


@pytest.fixture(scope="module")
def guess(examples_importable: None) -> Iterator[OpenEnvFactory]:
    factory = OpenEnvFactory(CLIENT, app="guess_env.server.app:app", n_train=20, n_val=5, n_test=5, sessions=8)
    yield factory
    factory.close()


@pytest.fixture(scope="module")
def slow(examples_importable: None) -> Iterator[OpenEnvFactory]:
    factory = OpenEnvFactory(CLIENT, app="openenv_sabotage:app", n_train=6, n_val=1, n_test=1, step_timeout_s=1.0)
    yield factory
    factory.close()


def guess_call(value: object) -> Message:
    args = json.dumps({"guess": value})
    return Message("assistant", args, channel="commentary", recipient="functions.step", content_type="json")


def bisect_engine() -> ScriptedEngine:
    """Finds the number by bisection, reading the environment's hints from the prompt (1..16)."""

    def script(prompt: Sequence[int]) -> list[int]:
        lo, hi = 1, 16
        for hint, n in re.findall(r"It is (higher|lower) than (\d+)", TOK.decode(prompt)):
            lo, hi = (int(n) + 1, hi) if hint == "higher" else (lo, int(n) - 1)
        return render_completion(TOK, [guess_call((lo + hi) // 2)])

    return ScriptedEngine(script)


def episode(factory: OpenEnvFactory, split: str = "test", index: int = 0) -> Trajectory:
    task = factory.tasks(split)[index]  # type: ignore[arg-type]
    env = factory.make(task)

    async def run() -> Trajectory:
        try:
            return await run_episode(bisect_engine(), env, TOK, PARAMS, LIMITS, task_id=task.id, group_id=0, seed=0)
        finally:
            await env.close()

    return asyncio.run(run())


def play(factory: OpenEnvFactory, *turns: Message) -> list[StepResult]:
    async def run() -> list[StepResult]:
        env = factory.make(factory.tasks("train")[0])
        try:
            await env.reset()
            return [await env.step([t]) for t in turns]
        finally:
            await env.close()

    return asyncio.run(run())


def test_the_action_is_one_typed_tool_and_the_splits_are_disjoint_seeds(guess: OpenEnvFactory) -> None:
    (spec,) = guess.make(guess.tasks("train")[0]).tools
    assert spec.name == "step" and spec.description == "Guess the hidden number."
    assert spec.parameters["properties"] == {
        "guess": {"type": "integer", "description": "Your guess, a whole number in the range the game states."}
    }
    prompts = [{t.prompt for t in guess.tasks(s)} for s in ("train", "validation", "test")]
    assert [len(p) for p in prompts] == [20, 5, 5]
    assert not (prompts[0] & prompts[1] or prompts[0] & prompts[2] or prompts[1] & prompts[2])


def test_a_found_number_is_reward_1_and_the_trained_ids_are_the_sampled_ones(guess: OpenEnvFactory) -> None:
    traj = episode(guess)
    assert traj.failure is None and traj.terminated and traj.reward == 1.0
    assert traj.reward_terms["correct"] == 1.0 and traj.reward_terms["return"] == 1.0
    assert traj.parity_mismatches == 0 and 1 <= traj.reward_terms["steps"] <= 5 and len(traj.turns) >= 1
    fresh = guess.make(guess.tasks("test")[0])

    async def opening() -> list[Message]:
        try:
            return initial_messages(fresh, await fresh.reset())
        finally:
            await fresh.close()

    messages = asyncio.run(opening())
    for turn in traj.turns:
        messages += [*turn.sampled, *turn.observations]
    assert list(traj.token_ids) == render_training(TOK, messages)


def test_what_the_model_did_wrong_is_an_observation_and_a_final_message_scores_0(guess: OpenEnvFactory) -> None:
    raised, mistyped, hint, end = play(
        guess, guess_call(99), guess_call("eight"), guess_call(1), Message("assistant", "8", channel="final")
    )
    assert raised.failure is None and "guess 99 is outside 1..16" in raised.observations[0].content
    assert "EXECUTION_ERROR" in raised.observations[0].content and raised.info["tool_error"] == 1.0
    assert mistyped.failure is None and "invalid arguments" in mistyped.observations[0].content
    assert hint.failure is None and hint.observations[0].content.startswith(("It is higher than 1", "1 is right"))
    assert end.terminated and end.reward == 0.0 and end.info["format_error"] == 1.0


def test_a_step_without_an_answer_is_a_masked_timeout(slow: OpenEnvFactory) -> None:
    (result,) = play(slow, guess_call(13))
    assert result.failure is not None and result.failure.kind == "tool_timeout", result


def test_a_server_that_died_mid_episode_is_a_masked_crash(examples_importable: None) -> None:
    factory = OpenEnvFactory(CLIENT, app="guess_env.server.app:app", n_train=2, n_val=1, n_test=1)

    async def run() -> StepResult:
        env = factory.make(factory.tasks("train")[0])
        await env.reset()
        assert factory.server is not None
        factory.server.stop()
        try:
            return await env.step([guess_call(8)])
        finally:
            await env.close()

    result = asyncio.run(run())
    assert result.failure is not None and result.failure.kind == "tool_crash", result
    assert "ConnectionClosed" in result.failure.detail or "Connection" in result.failure.detail


def test_more_episodes_than_server_sessions_queue_instead_of_faulting(examples_importable: None) -> None:
    slow = OpenEnvFactory(CLIENT, app="openenv_sabotage:app", n_train=3, n_val=1, n_test=1, step_timeout_s=10.0)

    async def three() -> list[Trajectory]:
        async def one(i: int) -> Trajectory:
            task = slow.tasks("train")[i]
            env = slow.make(task)
            try:
                return await run_episode(bisect_engine(), env, TOK, PARAMS, LIMITS, task_id=task.id, group_id=i, seed=0)
            finally:
                await env.close()

        return await asyncio.gather(*(one(i) for i in range(3)))

    try:
        trajs = asyncio.run(three())
    finally:
        slow.close()
    assert [t.failure for t in trajs] == [None] * 3 and all(t.terminated for t in trajs)


def test_the_factory_passes_check_env(guess: OpenEnvFactory) -> None:
    assert errors(check_env(guess, n_tasks=2)) == []


def test_a_url_that_does_not_answer_is_one_line(examples_importable: None) -> None:
    with pytest.raises(UserCodeError, match=r"env.url http://127.0.0.1:9 does not answer \(") as e:
        OpenEnvFactory(CLIENT, url="http://127.0.0.1:9", n_train=2, n_val=1, n_test=1)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"client": "no_such_env:Client", "url": "http://127.0.0.1:9"}, "module 'no_such_env' not found"),
        ({"client": "guess_env.models:GuessAction", "url": "http://127.0.0.1:9"}, "is not an OpenEnv EnvClient"),
        ({"client": CLIENT, "app": "guess_env.server.app:no_app"}, r"the server exited \(\d+\) before it answered"),
        ({"client": CLIENT}, "exactly one of env.url"),
    ],
)
def test_bad_input_is_refused_in_one_line(examples_importable: None, kwargs: dict[str, str], message: str) -> None:
    with pytest.raises(UserCodeError, match=message) as e:
        OpenEnvFactory(**kwargs, n_train=2, n_val=1, n_test=1)
    assert "\n" not in str(e.value)


def test_the_run_config_builds_it_on_a_running_server_and_records_the_version(guess: OpenEnvFactory) -> None:
    from importlib.metadata import version

    from harmonyrl.config import load_config
    from harmonyrl.tasks.factory import make_factory

    env = load_config(None, ["env.name=openenv", f"env.client={CLIENT}", f"env.url={guess.url}", "env.n_train=6"]).env
    assert env.package_version == version("openenv-core")  # type: ignore[union-attr]
    factory = make_factory(env, seed=0)
    assert len(factory.tasks("train")) == 6 and factory.tasks("test")[0] == guess.tasks("test")[0]
