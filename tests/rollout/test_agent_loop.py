"""The agent loop against a scripted engine: token in / token out, loss mask, parity check, failures."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from fakes import ScriptedEngine
from harmonyrl.harmony.render import render_completion, render_training
from harmonyrl.harmony.tokenizer import HarmonyTokenizer
from harmonyrl.rollout.agent_loop import EpisodeLimits, initial_messages, run_episode
from harmonyrl.rollout.scheduler import EpisodeRequest, run_episodes
from harmonyrl.tasks.calculator import CalculatorFactory, expression_of
from harmonyrl.types import Message, SamplingParams, StepResult

TOK = HarmonyTokenizer.load_default()
FACTORY = CalculatorFactory(seed=0, n_train=50, n_test=10)
TASK = FACTORY.tasks("train")[0]
LIMITS = EpisodeLimits(max_turns=4, max_new_tokens=64, max_seq_len=512)
PARAMS = SamplingParams(stop_ids=TOK.special.stop_ids)


def call_msg(expr: str) -> Message:
    return Message(
        role="assistant",
        channel="commentary",
        recipient="functions.calculator",
        content_type="json",
        content=f'{{"expression": "{expr}"}}',
    )


def final_msg(text: str) -> Message:
    return Message(role="assistant", channel="final", content=text)


def run(engine: ScriptedEngine, limits: EpisodeLimits = LIMITS, factory: CalculatorFactory = FACTORY):
    return asyncio.run(
        run_episode(engine, factory.make(TASK), TOK, PARAMS, limits, task_id=TASK.id, group_id=0, seed=1)
    )


def test_tool_episode_token_stream_and_loss_mask() -> None:
    call, final = call_msg(expression_of(TASK)), final_msg(TASK.answer)
    c1, c2 = render_completion(TOK, [call]), render_completion(TOK, [final])
    traj = run(ScriptedEngine([c1, c2]))
    assert traj.reward == 1.0 and traj.terminated and not traj.truncated and traj.success
    assert traj.parity_mismatches == 0
    # the token stream is the canonical training render of the whole conversation
    env = FACTORY.make(TASK)
    prefix = initial_messages(env, asyncio.run(env.reset()))
    tool_result = traj.turns[0].observations[0]
    assert list(traj.token_ids) == render_training(TOK, [*prefix, call, tool_result, final])
    # loss mask is 1 exactly on the two sampled completions, 0 on prompt and tool output
    sampled = [t for t, m in zip(traj.token_ids, traj.loss_mask, strict=True) if m]
    assert sampled == c1 + c2
    assert sum(traj.loss_mask) == len(c1) + len(c2)
    tool_ids = TOK.encode(tool_result.content)
    start = next(i for i in range(len(traj.token_ids)) if list(traj.token_ids[i : i + len(tool_ids)]) == tool_ids)
    assert all(m == 0 for m in traj.loss_mask[start : start + len(tool_ids)])
    # sampler log-probs sit exactly on the sampled tokens
    assert all((lp == -0.5) == bool(m) for lp, m in zip(traj.sampler_logprobs, traj.loss_mask, strict=True))


def test_injected_retokenisation_divergence_is_caught_and_sampled_ids_kept() -> None:
    call = call_msg(expression_of(TASK))
    canonical = render_completion(TOK, [call])
    # same text, non-canonical ids: the JSON content spelt one character at a time
    header_end = canonical.index(TOK.special.message) + 1
    odd = canonical[:header_end] + [i for ch in call.content for i in TOK.encode(ch)] + [TOK.special.call]
    assert odd != canonical and TOK.decode(odd) == TOK.decode(canonical)
    traj = run(ScriptedEngine([odd, render_completion(TOK, [final_msg(TASK.answer)])]))
    assert traj.parity_mismatches == 1
    first = traj.loss_mask.index(1)
    assert list(traj.token_ids[first : first + len(odd)]) == odd  # trained on what was sampled


def test_parse_error_is_the_models_fault() -> None:
    bad = [TOK.special.channel, *TOK.encode("nonsense"), TOK.special.return_]
    traj = run(ScriptedEngine([bad]))
    assert traj.terminated and not traj.truncated and traj.failure is None and traj.reward == 0.0
    assert traj.turns[0].parse_error is not None and traj.reward_terms["parse_error"] == 1.0


def test_token_budget_truncates() -> None:
    long = render_completion(TOK, [call_msg("1 + 1" * 40)])
    traj = run(ScriptedEngine([long]), EpisodeLimits(4, 20, 512))
    assert traj.truncated and not traj.terminated and traj.num_sampled == 20


def test_turn_limit_truncates() -> None:
    call = render_completion(TOK, [call_msg("1 + 1")])
    traj = run(ScriptedEngine([call, call]), EpisodeLimits(2, 64, 512))
    assert traj.truncated and not traj.terminated and len(traj.turns) == 2


class TimeoutEnvFactory(CalculatorFactory):
    def make(self, task):  # type: ignore[no-untyped-def]
        env = super().make(task)

        async def step(action: Sequence[Message]) -> StepResult:
            from harmonyrl.types import Failure

            return StepResult(failure=Failure("tool_timeout", "sandbox took too long"))

        env.step = step  # type: ignore[method-assign]
        return env


def test_environment_fault_is_a_failure_not_a_zero() -> None:
    call = render_completion(TOK, [call_msg("1 + 1")])
    traj = run(ScriptedEngine([call]), factory=TimeoutEnvFactory(seed=0, n_train=50, n_test=10))
    assert traj.failure is not None and traj.failure.kind == "tool_timeout"
    assert not traj.terminated and not traj.truncated


class CrashingFactory(CalculatorFactory):
    def make(self, task):  # type: ignore[no-untyped-def]
        if task.id.endswith("1"):
            raise RuntimeError("env exploded")
        return super().make(task)


def test_one_crashing_episode_does_not_abort_the_step() -> None:
    tasks = FACTORY.tasks("train")[:2]
    final = render_completion(TOK, [final_msg("0")])
    engine = ScriptedEngine([final, final])
    reqs = [EpisodeRequest(t, i, i) for i, t in enumerate(tasks)]
    out = asyncio.run(
        run_episodes(
            engine,
            CrashingFactory(seed=0, n_train=50, n_test=10),
            TOK,
            reqs,
            PARAMS,
            LIMITS,
            max_concurrency=4,
        )
    )
    kinds = [t.failure.kind if t.failure else None for t in out.trajectories]
    assert sorted(kinds, key=str) == sorted([None, "env_error"], key=str)


@pytest.mark.parametrize("turn", [0, 1, 7])
def test_turn_seeds_are_stable(turn: int) -> None:
    from harmonyrl.rollout.agent_loop import turn_seed

    assert turn_seed(5, turn) == turn_seed(5, turn) and turn_seed(5, turn) != turn_seed(6, turn)
