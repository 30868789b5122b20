"""The TRL adapter (benchmarks/vs_trl.py): TRL sees the calculator task as harmonyrl's agent loop does.

* the chat template renders the agent loop's prompt id for id, and TRL's own tool-suffix code (run on the
  template) gives exactly the observation ids the agent loop appends;
* the response template makes TRL's parser find harmonyrl's tool calls and final answers;
* replaying a completion scores it as the agent loop scored the same episode (hand-written turns run through
  ``run_episode`` with a scripted engine: its reward is the reference).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmark_module import load_benchmark
from fakes import ScriptedEngine
from harmonyrl.harmony.render import render_completion, render_prompt
from harmonyrl.harmony.tokenizer import HarmonyTokenizer
from harmonyrl.rollout.agent_loop import EpisodeLimits, initial_messages, observation_ids, run_episode
from harmonyrl.tasks.arith import calculator
from harmonyrl.tasks.calculator import CalculatorFactory, expression_of
from harmonyrl.types import Message, SamplingParams

TOK = HarmonyTokenizer.load_default()
FACTORY = CalculatorFactory(seed=0, n_train=4, n_test=1)
TASK = FACTORY.tasks("train")[0]  # "Evaluate 15 * 43 * 7." = 4515 (asserted below)

trl_adapter = load_benchmark("trl_adapter")  # benchmarks/trl_adapter.py: what vs_trl.py gives TRL
HarmonyReward = trl_adapter.HarmonyReward
prompt_messages = trl_adapter.prompt_messages
score_completion = trl_adapter.score_completion
split_turns = trl_adapter.split_turns
trl_tokenizer = trl_adapter.trl_tokenizer


def call(expression: str) -> Message:
    return Message(
        "assistant", json.dumps({"expression": expression}), "commentary", "functions.calculator", None, "json"
    )


def final(text: str) -> Message:
    return Message("assistant", text, "final")


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory) -> object:
    folder = tmp_path_factory.mktemp("tok")
    TOK.save_pretrained(folder)  # what a checkpoint folder holds
    return trl_tokenizer(Path(folder))


def test_task_is_the_one_the_expected_values_assume() -> None:
    assert (expression_of(TASK), TASK.answer) == ("15 * 43 * 7", "4515")


def test_chat_template_renders_the_agent_loops_prompt(hf: object) -> None:
    env = FACTORY.make(TASK)
    ours = render_prompt(TOK, initial_messages(env, asyncio.run(env.reset())))
    messages = asyncio.run(prompt_messages(FACTORY, TASK))
    theirs = hf.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)  # type: ignore[attr-defined]
    assert list(theirs) == ours


def test_trl_tool_suffix_is_the_agent_loops_observation(hf: object) -> None:
    from trl.chat_template_utils import is_chat_template_prefix_preserving
    from trl.trainer.grpo_trainer import GRPOTrainer

    assert is_chat_template_prefix_preserving(hf)  # else TRL would swap in a template of its own
    # TRL's own method, on a stand-in for the trainer holding what it reads
    trainer = SimpleNamespace(
        processing_class=hf, chat_template=None, chat_template_kwargs={}, _is_vlm=False, _tokenizer=hf
    )
    result = calculator("15 * 43 * 7")
    suffix = GRPOTrainer._get_tool_suffix_ids(trainer, [{"role": "tool", "name": "calculator", "content": result}])
    observed = asyncio.run(FACTORY.make(TASK).step([call("15 * 43 * 7")])).observations
    assert suffix == observation_ids(TOK, observed)


@pytest.mark.parametrize("recipient_after_channel", [False, True])
def test_trl_parser_finds_a_tool_call(hf: object, recipient_after_channel: bool) -> None:
    from trl.chat_template_utils import parse_response

    prefix = render_prompt(TOK, [Message("user", "hi")])
    ids = render_completion(TOK, [call("2 + 3")], recipient_after_channel=recipient_after_channel)
    parsed = parse_response(hf, ids, prefix=prefix, tools=[calculator])
    expected = {"name": "calculator", "arguments": {"expression": "2 + 3"}}
    assert parsed["tool_calls"] == [{"type": "function", "function": expected}]


def test_trl_parser_reads_a_final_answer_as_content(hf: object) -> None:
    from trl.chat_template_utils import parse_response

    prefix = render_prompt(TOK, [Message("user", "hi")])
    parsed = parse_response(hf, render_completion(TOK, [final("4515")]), prefix=prefix, tools=[calculator])
    assert parsed["content"] == "4515" and "tool_calls" not in parsed


def test_split_turns_cuts_at_stops_and_the_handover() -> None:
    first, last = render_completion(TOK, [call("15 * 43 * 7")]), render_completion(TOK, [final("4515")])
    obs = observation_ids(TOK, asyncio.run(FACTORY.make(TASK).step([call("15 * 43 * 7")])).observations)
    turns = split_turns(TOK, [*first, *obs, *last])
    assert turns.sampled == (tuple(first), tuple(last)) and turns.inserted == (tuple(obs),)
    cut = split_turns(TOK, first[:-1])  # no stop id: one unterminated turn
    assert cut.sampled == (tuple(first[:-1]),) and cut.inserted == ()


def agent_loop_episode(turns: list[list[int]], max_turns: int = 4) -> tuple[float, list[int]]:
    """The reward harmonyrl's agent loop gives these sampled turns, and the episode's completion ids (everything
    after the prompt: what TRL's completion holds for the same episode)."""
    engine = ScriptedEngine(turns)
    limits = EpisodeLimits(max_turns=max_turns, max_new_tokens=64, max_seq_len=512)
    params = SamplingParams(stop_ids=TOK.special.stop_ids)
    traj = asyncio.run(
        run_episode(engine, FACTORY.make(TASK), TOK, params, limits, task_id=TASK.id, group_id=0, seed=0)
    )
    return traj.reward, list(traj.token_ids[len(engine.prompts[0]) :])


CALL = render_completion(TOK, [call("15 * 43 * 7")])
EPISODES = {
    # turns → the agent loop's reward: 1 (tool, then the number), 1 (the number alone: the checker does not ask how)
    "tool then answer": ([CALL, render_completion(TOK, [final("4515")])], 1.0),
    "answer with a period": ([CALL, render_completion(TOK, [final(" 4515.")])], 1.0),
    "no tool": ([render_completion(TOK, [final("4515")])], 1.0),
    "sentence": ([CALL, render_completion(TOK, [final("The answer is 4515.")])], 0.0),
    "wrong number": ([CALL, render_completion(TOK, [final("4516")])], 0.0),
    "bad expression, retry": (
        [render_completion(TOK, [call("15 ** x")]), CALL, render_completion(TOK, [final("4515")])],
        1.0,
    ),
    "cut off": ([CALL[:-1]], 0.0),
    "no channel": ([[*TOK.encode("4515"), TOK.special.return_]], 0.0),
    "tool forever": ([CALL, CALL, CALL, CALL], 0.0),
}


@pytest.mark.parametrize("name", list(EPISODES))
def test_replay_scores_as_the_agent_loop(name: str) -> None:
    turns, expected = EPISODES[name]
    reward, completion = agent_loop_episode(turns)
    assert reward == expected
    score = asyncio.run(score_completion(TOK, FACTORY, TASK, completion))
    assert (score.reward, score.tool_parity) == (expected, True)


def test_completion_ending_on_a_tool_result_is_truncated() -> None:
    # TRL's turn limit or length budget stops after inserting the result: no answer, no reward
    _, completion = agent_loop_episode([CALL, render_completion(TOK, [final("4515")])])
    upto_result = completion[: len(completion) - len(render_completion(TOK, [final("4515")]))]
    assert asyncio.run(score_completion(TOK, FACTORY, TASK, upto_result)).reward == 0.0


def test_reward_function_takes_trls_arguments_and_counts_parity() -> None:
    _, good = agent_loop_episode([CALL, render_completion(TOK, [final("4515")])])
    forged = list(good)
    digit = TOK.encode("4")[0]
    forged[len(CALL) + forged[len(CALL) :].index(digit)] = TOK.encode("9")[0]  # the tool "said" 9515
    reward = HarmonyReward(TOK, FACTORY, {TASK.id: TASK})
    out = reward(
        prompts=[[]] * 2,
        completions=[[]] * 2,
        completion_ids=[good, forged],
        task_id=[TASK.id] * 2,
        trainer_state=None,
        log_extra=None,
        log_metric=None,
    )
    assert out == [1.0, 1.0]  # the answer is graded, whatever TRL inserted
    assert (reward.scored, reward.parity_failures) == (2, 1)
