"""Whole rollout episodes on the o200k_harmony vocabulary, id for id against openai-harmony.

The agent loop (a scripted engine emitting canonical completions, the real calculator env and its tool) builds
the episode's token stream turn by turn: prompt, sampled completion, tool observation + hand-back header, ...
That stream must be openai-harmony's training render of the same conversation (analysis kept), every sampled
span must parse back (with our parser and with openai-harmony's) into what was sampled, and the loss mask must
cover exactly the sampled spans.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from test_harmony_parity import Case, _oh_conversation

from fakes import ScriptedEngine
from harmonyrl.harmony import O200kCodec, parse_completion, render_completion
from harmonyrl.rollout.agent_loop import EpisodeLimits, initial_messages, run_episode
from harmonyrl.tasks.calculator import CalculatorFactory, expression_of
from harmonyrl.types import Message, SamplingParams, Trajectory

FACTORY = CalculatorFactory(seed=0, n_train=50, n_test=10)
LIMITS = EpisodeLimits(max_turns=4, max_new_tokens=128, max_seq_len=1024)


def _call(expr: str) -> Message:
    return Message(
        "assistant", f'{{"expression": "{expr}"}}', "commentary", "functions.calculator", content_type="json"
    )


def _episode(codec: O200kCodec, turns: list[list[Message]], task_index: int) -> tuple[Trajectory, list[Message]]:
    task = FACTORY.tasks("train")[task_index]
    engine = ScriptedEngine([render_completion(codec, turn) for turn in turns])
    params = SamplingParams(stop_ids=codec.special.stop_ids)
    traj = asyncio.run(
        run_episode(engine, FACTORY.make(task), codec, params, LIMITS, task_id=task.id, group_id=0, seed=1)
    )
    env = FACTORY.make(task)
    prefix = initial_messages(env, asyncio.run(env.reset()))
    return traj, prefix


SCRIPTS = {
    # analysis, tool call, (tool result), final answer: the calculator's canonical solved episode
    "tool_then_answer": lambda task: [
        [Message("assistant", "I need the calculator.", "analysis"), _call(expression_of(task))],
        [Message("assistant", task.answer, "final")],
    ],
    # a tool call, then a second one, then a sentence answer (graded wrong; rendering does not care)
    "two_calls_verbose": lambda task: [
        [_call(expression_of(task))],
        [_call(f"({expression_of(task)}) * 1")],
        [Message("assistant", f"The answer is {task.answer}.", "final")],
    ],
    "guess_without_tool": lambda task: [[Message("assistant", "12345", "final")]],
}


@pytest.mark.parametrize("script", sorted(SCRIPTS))
@pytest.mark.parametrize("task_index", [0, 7])
def test_rollout_tokens_equal_openai_harmony(o200k: O200kCodec, harmony_enc: Any, script: str, task_index: int) -> None:
    import openai_harmony as oh

    task = FACTORY.tasks("train")[task_index]
    turns = SCRIPTS[script](task)
    traj, prefix = _episode(o200k, turns, task_index)
    assert traj.parity_mismatches == 0 and traj.failure is None and len(traj.turns) == len(turns)
    conversation: list[Message] = []
    for turn, record in zip(turns, traj.turns, strict=True):
        conversation += [*turn, *record.observations]  # tool results exactly as the env returned them
    env = FACTORY.make(task)
    case = Case(
        script,
        list(env.tools),
        [*prefix[2:], *conversation],
        instructions=env.instructions,
        system_kw={"model_identity": None, "knowledge_cutoff": None},
    )
    # a rollout keeps the analysis it sampled (token in, token out): openai-harmony's render without its CoT drop
    keep_analysis = oh.RenderConversationConfig(auto_drop_analysis=False)
    expected = harmony_enc.render_conversation_for_training(_oh_conversation(oh, case), keep_analysis)
    assert list(traj.token_ids) == expected
    # the loss mask covers exactly the sampled spans; each parses back into what was sampled, with both parsers
    spans: list[list[int]] = [[]]
    for token, m in zip(traj.token_ids, traj.loss_mask, strict=True):
        if m:
            spans[-1].append(token)
        elif spans[-1]:
            spans.append([])
    spans = [s for s in spans if s]
    assert spans == [render_completion(o200k, turn) for turn in turns]
    for span, turn in zip(spans, turns, strict=True):
        ours = parse_completion(o200k, span)
        assert ours.error is None and list(ours.messages) == turn
        ref = harmony_enc.parse_messages_from_completion_tokens(span, oh.Role.ASSISTANT)
        assert [(m.channel, m.recipient, m.content[0].text) for m in ref] == [
            (m.channel, m.recipient, m.content) for m in turn
        ]
