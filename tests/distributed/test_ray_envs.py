"""Environments on Ray env workers, in one process against a real local Ray cluster (started once per module).

What must hold: episodes through the workers equal episodes run in-process; a worker that dies masks its
episodes as environment faults and the rollout goes on (the worker restarts); a tool's own timeout and the
episode's wall-clock budget still work inside the workers; a pool that cannot start is a one-line error.
The engine is the scripted calculator solver (``fakes.calculator_solver``): it calls the tool, then answers.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal

import pytest
import ray
from ray.util.placement_group import placement_group_table

from fakes import calculator_solver
from harmonyrl.config import ScaleConfig
from harmonyrl.distributed.ray_cluster import start_env_pool
from harmonyrl.distributed.ray_envs import EnvPool, NoLiveWorkers, RayEnvFactory, env_pool_metrics
from harmonyrl.envs.base import EnvFactory
from harmonyrl.envs.reward import OUTCOME_ONLY, AnswerEnv
from harmonyrl.envs.tools import Tool, Toolbox
from harmonyrl.errors import ClusterError
from harmonyrl.harmony.tokenizer import HarmonyTokenizer
from harmonyrl.rollout.agent_loop import EpisodeLimits
from harmonyrl.rollout.scheduler import group_requests, run_episodes
from harmonyrl.tasks.calculator import INSTRUCTIONS, CalculatorEnv, CalculatorFactory, calculator, generate_tasks
from harmonyrl.types import Failure, SamplingParams, Task, Trajectory
from tiny_run import tiny_run

TOK = HarmonyTokenizer.load_default()
PARAMS = SamplingParams(stop_ids=(TOK.special.call, TOK.special.return_))
LIMITS = EpisodeLimits(max_turns=3, max_new_tokens=64, max_seq_len=512, timeout_s=60.0)


class SlowCalculatorFactory:
    """Calculator tasks whose tool first sleeps ``delay_s`` (an async sleep: CPU-light), under ``timeout_s``."""

    name = "slow_calculator"

    def __init__(self, delay_s: float, timeout_s: float = 30.0) -> None:
        self._train, self._test = generate_tasks(0, 32, 4)

        async def slow_calculator(expression: str) -> str:
            """Evaluate an arithmetic expression, slowly.

            Args:
                expression: Integer arithmetic, e.g. "347 * 28 + 1191".
            """
            await asyncio.sleep(delay_s)
            return calculator(expression)

        slow_calculator.__name__ = "calculator"  # the scripted solver calls ``functions.calculator``
        self._toolbox = Toolbox([Tool.from_function(slow_calculator, timeout_s=timeout_s)])

    def tasks(self, split: Literal["train", "test"]) -> Sequence[Task]:
        return self._train if split == "train" else self._test

    def make(self, task: Task) -> AnswerEnv:
        return AnswerEnv(task, self._toolbox, INSTRUCTIONS, OUTCOME_ONLY)


class BrokenStepFactory(CalculatorFactory):
    """Calculator tasks whose env's ``step`` raises, as a buggy environment does."""

    def make(self, task: Task) -> CalculatorEnv:
        env = super().make(task)

        async def step(action: object) -> None:
            raise ValueError(f"boom in {task.id}")

        env.step = step  # type: ignore[method-assign,assignment]
        return env


def _failing_recipe() -> EnvFactory:
    raise FileNotFoundError("tasks file '/nowhere/tasks.jsonl' does not exist")


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    """A local Ray cluster for this module; this test module is shipped to the workers by value (they cannot
    import it: ``tests/`` is on the driver's path only)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_AUTH_MODE", "disabled")
        mp.setenv("RAY_USAGE_STATS_ENABLED", "0")
        ray.init(num_cpus=4, include_dashboard=False, logging_level="WARNING")
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        yield
        ray.shutdown()


def _pool(local: EnvFactory, recipe: functools.partial[EnvFactory], **scale: object) -> RayEnvFactory:
    return start_env_pool(ScaleConfig.model_validate({"ray": True, "worker_cpus": 0.5, **scale}), recipe, local)


def _rollout(factory: EnvFactory, tasks: Sequence[Task], group_size: int = 1, limits: EpisodeLimits = LIMITS):
    engine = calculator_solver(TOK, tasks)
    requests = group_requests(tasks, group_size, base_seed=7)
    return asyncio.run(run_episodes(engine, factory, TOK, requests, PARAMS, limits, max_concurrency=64))


def _what_the_model_saw(t: Trajectory) -> tuple[object, ...]:
    """A trajectory without its wall-clock fields (``gen_s``, ``tool_s`` of each turn)."""
    turns = tuple((turn.sampled, turn.parse_error, turn.observations) for turn in t.turns)
    return (t.task_id, t.group_id, t.token_ids, t.loss_mask, t.sampler_logprobs, t.reward, t.terminated,
            t.truncated, t.failure, turns, t.reward_terms)  # fmt: skip


def test_episodes_on_workers_equal_episodes_in_process(cluster: None) -> None:
    local = CalculatorFactory(0, 64, 8)
    factory = _pool(local, functools.partial(CalculatorFactory, 0, 64, 8), env_workers=2)
    try:
        tasks = local.tasks("train")[:6]
        on_workers, here = _rollout(factory, tasks, group_size=2), _rollout(local, tasks, group_size=2)
        assert [_what_the_model_saw(t) for t in on_workers.trajectories] == [
            _what_the_model_saw(t) for t in here.trajectories
        ]
        assert all(t.reward == 1.0 and len(t.turns) == 2 for t in on_workers.trajectories)  # a tool call, an answer
        assert all(t.turns[0].observations for t in on_workers.trajectories)  # the tool ran in a worker
        assert factory.pool.open == [0, 0]  # every episode closed its env again
        assert env_pool_metrics(factory) == {"env/worker_faults": 0.0, "env/workers_alive": 2.0}
    finally:
        factory.pool.close()


def test_an_env_exception_in_a_worker_is_recorded_as_it_is_in_process(cluster: None) -> None:
    local = BrokenStepFactory(0, 8, 2)
    factory = _pool(local, functools.partial(BrokenStepFactory, 0, 8, 2), env_workers=1)
    try:
        tasks = local.tasks("train")[:2]
        on_worker, here = _rollout(factory, tasks), _rollout(local, tasks)
        assert [t.failure for t in on_worker.trajectories] == [t.failure for t in here.trajectories]
        assert on_worker.trajectories[0].failure == Failure("env_error", f"step: ValueError: boom in {tasks[0].id}")
    finally:
        factory.pool.close()


def test_a_killed_worker_masks_its_episodes_and_the_rollout_goes_on(cluster: None) -> None:
    local = SlowCalculatorFactory(delay_s=3.0)
    factory = _pool(local, functools.partial(SlowCalculatorFactory, 3.0), env_workers=2, worker_concurrency=8)
    try:
        pid = ray.get(factory.pool.workers[0].ready.remote())
        tasks = local.tasks("train")[:4]

        async def kill_soon() -> None:
            await asyncio.sleep(1.5)  # the 4 episodes are in their tool calls (3 s each) by then
            os.kill(pid, signal.SIGKILL)

        async def both() -> object:
            killer = asyncio.ensure_future(kill_soon())
            engine = calculator_solver(TOK, tasks)
            requests = group_requests(tasks, 1, base_seed=7)
            result = await run_episodes(engine, factory, TOK, requests, PARAMS, LIMITS, max_concurrency=64)
            await killer
            return result

        result = asyncio.run(both())
        failed = [t for t in result.trajectories if t.failure is not None]
        # least loaded, ties to the lowest index: episodes 0 and 2 went to worker 0, 1 and 3 to worker 1
        assert [t.failure is not None for t in result.trajectories] == [True, False, True, False]
        assert all(t.failure.kind == "env_error" and "Actor" in t.failure.detail for t in failed)
        assert all(t.reward == 1.0 for t in result.trajectories if t.failure is None)
        assert env_pool_metrics(factory)["env/worker_faults"] == 2.0
        # the next episodes run normally: on worker 1 while worker 0 restarts (scale.max_restarts), then on both
        again = _rollout(factory, tasks)
        assert [(t.failure, t.reward) for t in again.trajectories] == [(None, 1.0)] * 4
        deadline = time.monotonic() + 60
        while factory.pool.down and time.monotonic() < deadline:
            time.sleep(0.2)
            factory.pool.assign()  # re-checks the restarting worker
        assert not factory.pool.down and ray.get(factory.pool.workers[0].ready.remote()) != pid
        factory.pool.open = [0, 0]
        assert [factory.pool.assign() for _ in range(2)] == [0, 1]  # worker 0 takes episodes again
        assert env_pool_metrics(factory) == {"env/worker_faults": 0.0, "env/workers_alive": 2.0}
    finally:
        factory.pool.close()


def test_tool_timeout_and_episode_budget_work_inside_the_workers(cluster: None) -> None:
    local = SlowCalculatorFactory(delay_s=5.0, timeout_s=0.5)
    factory = _pool(local, functools.partial(SlowCalculatorFactory, 5.0, 0.5), env_workers=1)
    try:
        tasks = local.tasks("train")[:1]
        timed_out = _rollout(factory, tasks).trajectories[0]
        assert (
            timed_out.failure is not None and timed_out.failure.kind == "tool_timeout"
        )  # the Toolbox's, in the worker
    finally:
        factory.pool.close()
    local = SlowCalculatorFactory(delay_s=30.0)
    factory = _pool(local, functools.partial(SlowCalculatorFactory, 30.0), env_workers=1)  # one call at a time
    try:
        budget = EpisodeLimits(max_turns=3, max_new_tokens=64, max_seq_len=512, timeout_s=1.0)
        hung = _rollout(factory, tasks, limits=budget).trajectories[0]
        assert hung.failure is not None and hung.failure.kind == "episode_timeout"
        t0 = time.monotonic()  # the cancelled tool call no longer holds the worker's only slot
        assert ray.get(factory.pool.workers[0].open_episodes.remote(), timeout=10) == 0
        assert time.monotonic() - t0 < 5.0
    finally:
        factory.pool.close()


def test_a_worker_that_cannot_build_its_env_is_a_one_line_error(cluster: None) -> None:
    local = CalculatorFactory(0, 8, 2)
    with pytest.raises(ClusterError, match=r"could not build the environment: .*tasks\.jsonl' does not exist") as e:
        _pool(local, functools.partial(_failing_recipe), env_workers=1)
    assert "\n" not in str(e.value)
    groups = placement_group_table().values()
    assert all(g["state"] == "REMOVED" for g in groups)  # nothing left behind on the cluster


def test_a_pool_the_cluster_cannot_hold_is_a_one_line_error(cluster: None) -> None:
    local = CalculatorFactory(0, 8, 2)
    t0 = time.monotonic()
    with pytest.raises(ClusterError, match=r"3 env workers × 2 CPU could not be placed within 2 s \(the cluster has 4"):
        _pool(local, functools.partial(CalculatorFactory, 0, 8, 2), env_workers=3, worker_cpus=2, start_timeout_s=2)
    assert time.monotonic() - t0 < 10.0


def test_train_joins_an_existing_cluster_at_scale_address(cluster: None, tmp_path: Path) -> None:
    address = ray.get_runtime_context().gcs_address
    overrides = tiny_run("rl.steps=1", f"output_dir={tmp_path}", "run_name=r", "scale.ray=true")
    overrides.append(f"scale.address={address}")
    done = subprocess.run([sys.executable, "-m", "harmonyrl.cli", "train", *overrides], capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["env/worker_faults"], r["env/workers_alive"]) for r in rows if r["phase"] == "rl"] == [(0.0, 2.0)]
    groups = placement_group_table().values()
    assert all(g["state"] == "REMOVED" for g in groups)  # the run released its workers' placement group


def test_least_loaded_assignment_and_no_live_worker() -> None:
    pool = EnvPool(["w0", "w1", "w2"])  # type: ignore[list-item]  # assignment never touches a handle
    assert [pool.assign() for _ in range(4)] == [0, 1, 2, 0]
    pool.release(1)
    assert pool.assign() == 1  # the one with fewest open episodes, not the next in turn
    pool.dead = {0, 1, 2}
    with pytest.raises(NoLiveWorkers, match="all 3 env workers are dead"):
        pool.assign()


def test_no_live_worker_masks_the_episode_at_make() -> None:
    pool = EnvPool([])
    local = CalculatorFactory(0, 8, 2)
    result = _rollout(RayEnvFactory(pool, local), local.tasks("train")[:2])
    assert [t.failure.kind if t.failure else None for t in result.trajectories] == ["env_error", "env_error"]
    assert all("make: NoLiveWorkers" in t.failure.detail for t in result.trajectories if t.failure)
