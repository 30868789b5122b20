"""Failure semantics of the rollout: the episode's wall-clock budget, group retry, and malformed tool calls.

The engine is scripted (it replays fixed completions), so every episode's course is known in advance and the
expected failures, counts and rewards are exact.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Sequence

import pytest

from fakes import ScriptedEngine, calculator_solver
from harmonyrl.envs.tools import Tool, Toolbox, ToolInfraError
from harmonyrl.harmony.render import render_completion
from harmonyrl.harmony.tokenizer import HarmonyTokenizer
from harmonyrl.rollout.agent_loop import EpisodeLimits
from harmonyrl.rollout.scheduler import EpisodeRequest, RolloutResult, group_requests, run_episodes
from harmonyrl.tasks.calculator import CalculatorEnv, CalculatorFactory
from harmonyrl.types import Failure, Message, SamplingParams, StepResult, Task

TOK = HarmonyTokenizer.load_default()
TASKS = CalculatorFactory(seed=0, n_train=20, n_test=1).tasks("train")
PARAMS = SamplingParams(stop_ids=TOK.special.stop_ids)


def limits(timeout_s: float | None) -> EpisodeLimits:
    return EpisodeLimits(max_turns=4, max_new_tokens=64, max_seq_len=512, timeout_s=timeout_s)


def call_ids(content: str, tool: str = "calculator") -> list[int]:
    msg = Message("assistant", content, "commentary", recipient=f"functions.{tool}", content_type="json")
    return render_completion(TOK, [msg])


def final_ids(text: str) -> list[int]:
    return render_completion(TOK, [Message("assistant", text, "final")])


def call_then_answer(first: list[int]) -> ScriptedEngine:
    """Turn 1: ``first``; every later turn: the task's correct answer, read off the prompt's expression."""

    def turns(prompt: Sequence[int]) -> list[int]:
        text = TOK.decode(prompt)
        if "<|call|>" not in text:
            return first
        task = next(t for t in TASKS if t.prompt in text)
        return final_ids(task.answer)

    return ScriptedEngine(turns)


def correct_call_engine() -> ScriptedEngine:
    return calculator_solver(TOK, TASKS)


class ToolFactory:
    """Calculator tasks whose ``calculator`` tool is ``tool``."""

    name = "calculator"

    def __init__(self, tool: Tool) -> None:
        self.toolbox = Toolbox([tool])

    def tasks(self, split: str) -> Sequence[Task]:
        return TASKS

    def make(self, task: Task) -> CalculatorEnv:
        return CalculatorEnv(task, self.toolbox)


def rollout(factory: object, engine: ScriptedEngine, budget: float | None, n: int = 1, **kw: int) -> RolloutResult:
    reqs = [EpisodeRequest(TASKS[i], i, i) for i in range(n)]
    return asyncio.run(run_episodes(engine, factory, TOK, reqs, PARAMS, limits(budget), kw.pop("conc", 8), **kw))  # type: ignore[arg-type]


# ---- the episode's wall-clock budget ------------------------------------------------------------------


def test_budget_cancels_a_running_async_tool_and_masks_the_episode() -> None:
    events: list[str] = []

    async def calculator(expression: str) -> str:
        """Hangs."""
        events.append("started")
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            events.append("cancelled")
            raise
        return "never"

    factory = ToolFactory(Tool.from_function(calculator, timeout_s=60))
    start = time.perf_counter()
    out = rollout(factory, call_then_answer(call_ids('{"expression": "1 + 1"}')), budget=0.3)
    elapsed = time.perf_counter() - start
    [traj] = out.trajectories
    assert traj.failure == Failure("episode_timeout", "exceeded its 0.3 s wall-clock budget")
    assert (traj.reward, traj.terminated, traj.truncated) == (0.0, False, False)
    assert events == ["started", "cancelled"]  # the tool's own task was cancelled, not left running
    # masked (nothing to train on), but the record shows what hung: the call, with no observation yet
    assert traj.token_ids == () and traj.loss_mask == ()
    [turn] = traj.turns
    assert [m.recipient for m in turn.sampled] == ["functions.calculator"] and turn.observations == ()
    assert 0.3 <= elapsed < 2.0


def test_budget_does_not_wait_for_a_sync_tool_whose_thread_cannot_be_killed() -> None:
    finished = threading.Event()

    def calculator(expression: str) -> str:
        """Blocks its worker thread."""
        time.sleep(1.5)
        finished.set()
        return "late"

    factory = ToolFactory(Tool.from_function(calculator, timeout_s=60))
    start = time.perf_counter()
    out = rollout(factory, call_then_answer(call_ids('{"expression": "1 + 1"}')), budget=0.2)
    elapsed = time.perf_counter() - start
    assert out.trajectories[0].failure is not None and out.trajectories[0].failure.kind == "episode_timeout"
    assert elapsed < 1.0 and not finished.is_set()  # the step went on without the thread
    assert finished.wait(5.0)  # ... which ran to its end on its own; its result was discarded


def test_budget_counts_from_the_episodes_slot_not_from_the_queue() -> None:
    async def calculator(expression: str) -> str:
        """Takes 0.15 s."""
        await asyncio.sleep(0.15)
        return json.dumps({"result": 2})

    # one slot, three episodes of ~0.15 s each: 0.45 s in all, but each well inside its own 0.4 s
    factory = ToolFactory(Tool.from_function(calculator))
    out = rollout(factory, call_then_answer(call_ids('{"expression": "1 + 1"}')), budget=0.4, n=3, conc=1)
    assert [t.failure for t in out.trajectories] == [None, None, None]
    assert out.wall_s >= 0.45


def test_a_budget_that_does_not_expire_changes_nothing() -> None:
    factory = CalculatorFactory(seed=0, n_train=20, n_test=1)
    with_budget = rollout(factory, correct_call_engine(), budget=30.0, n=3)
    without = rollout(factory, correct_call_engine(), budget=None, n=3)
    strip = [(t.token_ids, t.loss_mask, t.reward, t.failure) for t in with_budget.trajectories]
    assert strip == [(t.token_ids, t.loss_mask, t.reward, t.failure) for t in without.trajectories]
    assert [t.reward for t in without.trajectories] == [1.0, 1.0, 1.0]


class InnerTimeoutFactory(CalculatorFactory):
    """An env whose own code raises TimeoutError: a broken env, not an expired budget."""

    def make(self, task: Task) -> CalculatorEnv:
        env = super().make(task)

        async def step(action: Sequence[Message]) -> StepResult:
            raise TimeoutError("database connection timed out")

        env.step = step  # type: ignore[method-assign]
        return env


def test_an_envs_own_timeout_error_is_an_env_error_not_the_budget() -> None:
    out = rollout(InnerTimeoutFactory(seed=0, n_train=20, n_test=1), correct_call_engine(), budget=30.0)
    [traj] = out.trajectories
    assert traj.failure == Failure("env_error", "step: TimeoutError: database connection timed out")
    [turn] = traj.turns  # the turn whose step raised stays in the record
    assert [m.recipient for m in turn.sampled] == ["functions.calculator"] and turn.observations == ()


# ---- group retry -------------------------------------------------------------------------------------


class FlakyFactory(CalculatorFactory):
    """The first ``bad_makes`` envs made for each task crash on their tool call; later ones work."""

    def __init__(self, bad_makes: int, tasks: Sequence[int] = ()) -> None:
        super().__init__(seed=0, n_train=20, n_test=1)
        self.bad_makes, self.bad_tasks = bad_makes, {TASKS[i].id for i in tasks}
        self.made: dict[str, int] = {}

    def make(self, task: Task) -> CalculatorEnv:
        n = self.made[task.id] = self.made.get(task.id, 0) + 1
        env = super().make(task)
        if task.id not in self.bad_tasks or n > self.bad_makes:
            return env

        async def step(action: Sequence[Message]) -> StepResult:
            return StepResult(failure=Failure("tool_crash", f"flaky make {n}"))

        env.step = step  # type: ignore[method-assign]
        return env


def grouped(factory: FlakyFactory, retries: int) -> RolloutResult:
    reqs = group_requests(TASKS[:3], group_size=4, base_seed=0)  # groups 0, 1, 2 of 4 episodes each
    run = run_episodes(correct_call_engine(), factory, TOK, reqs, PARAMS, limits(30.0), 16, retries)
    return asyncio.run(run)


def test_retry_recovers_a_group_that_faulted_once() -> None:
    factory = FlakyFactory(bad_makes=2, tasks=[1])  # task 1: its first two episodes crash
    out = grouped(factory, retries=1)
    assert [t.failure for t in out.trajectories] == [None] * 12
    assert [t.reward for t in out.trajectories] == [1.0] * 12
    assert out.fault_metrics() == {
        "rollout/group_retries": 1.0,
        "rollout/retried_episodes": 2.0,
        "rollout/faulted_groups": 0.0,
    }
    assert factory.made == {TASKS[0].id: 4, TASKS[1].id: 6, TASKS[2].id: 4}  # only the faulted two re-ran


def test_without_retry_the_faulted_episodes_stay_masked() -> None:
    out = grouped(FlakyFactory(bad_makes=2, tasks=[1]), retries=0)
    kinds = [t.failure.kind if t.failure else None for t in out.trajectories]
    assert kinds == [None] * 4 + ["tool_crash"] * 2 + [None] * 6
    assert out.fault_metrics() == {
        "rollout/group_retries": 0.0,
        "rollout/retried_episodes": 0.0,
        "rollout/faulted_groups": 1.0,
    }


def test_a_group_that_keeps_faulting_stays_masked_after_every_retry() -> None:
    factory = FlakyFactory(bad_makes=100, tasks=[0, 2])  # tasks 0 and 2 always crash
    out = grouped(factory, retries=2)
    kinds = [t.failure.detail if t.failure else None for t in out.trajectories]
    assert kinds == [f"flaky make {n}" for n in (9, 10, 11, 12)] + [None] * 4 + [
        f"flaky make {n}" for n in (9, 10, 11, 12)
    ]
    assert out.fault_metrics() == {
        "rollout/group_retries": 4.0,  # 2 groups x 2 rounds
        "rollout/retried_episodes": 16.0,
        "rollout/faulted_groups": 2.0,
    }


# ---- the model's malformed calls are observations or its own parse errors, never faults ---------------


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (call_ids("347 * 28"), "arguments are not valid JSON"),
        (call_ids('{"expression": "1 + 1"'), "arguments are not valid JSON"),
        (call_ids('{"expr": "1"}'), "expression: Field required"),
        (call_ids('{"expression": "1"}', tool="python"), "unknown tool 'python'"),
        (call_ids('{"expression": "9 ** 9 ** 9"}'), "exponent must be an integer with |exponent| <= 64"),
    ],
)
def test_malformed_calls_are_observations_and_the_episode_goes_on(call: list[int], needle: str) -> None:
    out = rollout(CalculatorFactory(seed=0, n_train=20, n_test=1), call_then_answer(call), budget=30.0)
    [traj] = out.trajectories
    assert (traj.failure, traj.reward, traj.terminated) == (None, 1.0, True)
    [observation] = traj.turns[0].observations
    assert needle in json.loads(observation.content)["error"]


def test_non_utf8_bytes_in_a_call_are_the_models_parse_error() -> None:
    s = TOK.special
    head = call_ids('{"expression": "1"}')
    body_at = head.index(s.message) + 1
    broken = [*head[:body_at], *TOK.encode("é")[:1], s.call]  # half of a two-byte UTF-8 character
    out = rollout(CalculatorFactory(seed=0, n_train=20, n_test=1), call_then_answer(broken), budget=30.0)
    [traj] = out.trajectories
    assert (traj.failure, traj.reward, traj.terminated, traj.truncated) == (None, 0.0, True, False)
    assert traj.reward_terms["parse_error"] == 1.0 and traj.turns[0].parse_error is not None
    assert traj.turns[0].parse_error.startswith("invalid_utf8")


def test_oversized_and_non_utf8_tool_output_is_an_observation() -> None:
    def calculator(expression: str) -> bytes:
        """Returns a flood of bytes that are not UTF-8."""
        return b"\xff\xfe" * 5000

    factory = ToolFactory(Tool.from_function(calculator, max_output_chars=100))
    out = rollout(factory, call_then_answer(call_ids('{"expression": "1"}')), budget=30.0)
    [traj] = out.trajectories
    assert (traj.failure, traj.reward) == (None, 1.0)
    assert traj.turns[0].observations[0].content == "\ufffd" * 100 + "\n…[truncated 9900 chars]"


# ---- a tool raising on the model's argument teaches; only a declared fault is masked ------------------

UNITS = {"km": 1000.0, "m": 1.0}


def test_a_tool_raising_on_the_models_argument_is_read_graded_and_trained_on() -> None:
    def calculator(expression: str) -> str:
        """Raises KeyError on a unit it does not know, as the tutorial's ``convert`` did on "rect"."""
        return str(UNITS[expression])

    factory = ToolFactory(Tool.from_function(calculator))
    out = rollout(factory, call_then_answer(call_ids('{"expression": "rect"}')), budget=30.0)
    [traj] = out.trajectories
    assert (traj.failure, traj.terminated, traj.reward) == (None, True, 1.0)  # graded on its answer as usual
    [observation] = traj.turns[0].observations  # the model read what went wrong, in its context
    assert json.loads(observation.content) == {"error": "calculator raised KeyError: 'rect'"}
    assert "raised KeyError" in TOK.decode(list(traj.token_ids)) and any(traj.loss_mask)  # in what is trained on
    assert out.fault_metrics()["rollout/faulted_groups"] == 0.0


def test_a_tool_declaring_an_infrastructure_failure_is_masked() -> None:
    def calculator(expression: str) -> str:
        """Its backend is down."""
        raise ToolInfraError("backend unreachable")

    out = rollout(ToolFactory(Tool.from_function(calculator)), call_then_answer(call_ids('{"expression": "1"}')), 30.0)
    [traj] = out.trajectories
    assert traj.failure == Failure("tool_crash", "calculator raised ToolInfraError: backend unreachable")
    assert (traj.reward, traj.terminated) == (0.0, False)  # a failure: the learner leaves it out of the loss


def test_every_episode_carries_its_tasks_prompt_and_expected_answer() -> None:
    done = rollout(CalculatorFactory(seed=0, n_train=20, n_test=1), correct_call_engine(), budget=30.0, n=2)
    assert [(t.task_prompt, t.expected_answer) for t in done.trajectories] == [(x.prompt, x.answer) for x in TASKS[:2]]

    async def calculator(expression: str) -> str:
        """Hangs."""
        await asyncio.sleep(30)
        return "never"

    hung = rollout(ToolFactory(Tool.from_function(calculator, timeout_s=60)), correct_call_engine(), budget=0.2)
    [traj] = hung.trajectories  # a masked episode too: its record is where a person looks for why
    assert traj.failure is not None and (traj.task_prompt, traj.expected_answer) == (TASKS[0].prompt, TASKS[0].answer)


def test_an_evaluation_counts_its_faults_by_class_per_pass() -> None:
    """Sampled and greedy passes each keep their failure classes (one ``env/`` key let the greedy pass overwrite
    the sampled one's), and none lands under ``env/failure_*``, which the RL fault plot reads."""
    from harmonyrl.run.evaluate import evaluate

    def calculator(expression: str) -> str:
        """Its backend is down."""
        raise ToolInfraError("backend unreachable")

    factory = ToolFactory(Tool.from_function(calculator))
    run = evaluate(correct_call_engine(), factory, TOK, TASKS[:2], limits(30.0), 1.0, 2, seed=0)  # type: ignore[arg-type]
    metrics = asyncio.run(run)
    assert (metrics["eval/failure_tool_crash"], metrics["eval_greedy/failure_tool_crash"]) == (4.0, 2.0)
    assert (metrics["eval/failed"], metrics["eval_greedy/failed"]) == (4.0, 2.0)
    assert not [k for k in metrics if k.startswith("env/")]
