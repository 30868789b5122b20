"""Fault injection: the rate and kinds asked for, deterministic under a seed, counted, and each kind ending its
episode exactly as a real fault of that kind does."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

from fakes import calculator_solver
from harmonyrl.config import ConfigError, load_config
from harmonyrl.envs.faults import EXPECTED_FAILURE, FaultInjector, InjectedKind, inject_faults, injected_metrics
from harmonyrl.harmony.tokenizer import HarmonyTokenizer
from harmonyrl.rollout.agent_loop import EpisodeLimits
from harmonyrl.rollout.scheduler import RolloutResult, group_requests, run_episodes
from harmonyrl.run.setup import with_faults
from harmonyrl.tasks.calculator import CalculatorFactory
from harmonyrl.types import SamplingParams

TOK = HarmonyTokenizer.load_default()
BASE = CalculatorFactory(seed=0, n_train=8, n_test=2)
PARAMS = SamplingParams(stop_ids=TOK.special.stop_ids)
LIMITS = EpisodeLimits(max_turns=4, max_new_tokens=64, max_seq_len=512, timeout_s=1.0)  # ends injected hangs


def roll(factory: FaultInjector, split: str = "train", group: int = 4, retries: int = 0) -> RolloutResult:
    reqs = group_requests(BASE.tasks(split)[:2], group, base_seed=0)  # type: ignore[arg-type]
    solver = calculator_solver(TOK, [*BASE.tasks("train"), *BASE.tasks("test")])
    return asyncio.run(run_episodes(solver, factory, TOK, reqs, PARAMS, LIMITS, 16, retries))


def test_rate_is_met_and_decisions_are_deterministic_under_the_seed() -> None:
    def decisions(seed: int) -> list[str | None]:
        f = inject_faults(BASE, 0.2, seed=seed)
        return [f.decide((seed, f"task-{i // 4}", i % 4), 0) for i in range(5000)]

    first = decisions(0)
    assert first == decisions(0) and first != decisions(1)
    counts = Counter(first)
    assert counts == {None: 3997, "tool_crash": 505, "tool_timeout": 498}  # 20.1 % injected, about half each


@pytest.mark.parametrize("kind", ["tool_timeout", "tool_crash", "sandbox_error", "env_error", "hang"])
def test_each_kind_ends_the_episode_as_its_real_fault_and_is_counted(kind: InjectedKind) -> None:
    factory = inject_faults(BASE, 1.0, kinds=(kind,))
    out = roll(factory)
    assert [t.failure.kind if t.failure else None for t in out.trajectories] == [EXPECTED_FAILURE[kind]] * 8
    assert all(t.reward == 0.0 for t in out.trajectories)
    assert factory.injected == {kind: 8} and factory.tool_calls == 8
    assert injected_metrics(factory) == {f"env/injected_{kind}": 8.0}


def test_faults_are_counted_per_kind_and_leave_the_rest_untouched() -> None:
    factory = inject_faults(BASE, 0.5, seed=0)
    out = roll(factory, group=8)
    failed = Counter(t.failure.kind for t in out.trajectories if t.failure is not None)
    assert failed == factory.injected  # every injected fault masked one episode, nothing else failed
    assert sum(failed.values()) == 7 and factory.tool_calls == 16
    assert [t.reward for t in out.trajectories if t.failure is None] == [1.0] * 9
    assert injected_metrics(factory) == {"env/injected_tool_timeout": 3.0, "env/injected_tool_crash": 4.0}


def test_held_out_tasks_and_rate_zero_are_never_faulted() -> None:
    factory = inject_faults(BASE, 1.0)
    out = roll(factory, split="test")
    assert [t.failure for t in out.trajectories] == [None] * 8 and factory.tool_calls == 0
    assert type(inject_faults(BASE, 0.0).make(BASE.tasks("train")[0])) is type(BASE.make(BASE.tasks("train")[0]))
    assert injected_metrics(BASE) == {}


def test_a_retried_episode_draws_afresh() -> None:
    factory = inject_faults(BASE, 0.5, seed=0)  # without retry: 7 of 16 episodes faulted (test above)
    out = roll(factory, group=8, retries=3)
    assert [t.failure for t in out.trajectories] == [None] * 16  # transient: all recovered within 3 rounds
    # every injected fault cost exactly one re-run, and every re-run ended healthy or with a new injected fault
    assert sum(factory.injected.values()) == out.retried_episodes == 13 and out.group_retries == 4


def test_an_injected_timeout_takes_its_delay() -> None:
    factory = inject_faults(BASE, 1.0, kinds=("tool_timeout",), timeout_delay_s=0.3)
    start = time.perf_counter()
    roll(factory, group=1)
    assert time.perf_counter() - start >= 0.3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rate": 1.5}, "fault rate must be in [0, 1], got 1.5"),
        ({"rate": 0.1, "kinds": ()}, "fault kinds must be a non-empty subset of"),
        ({"rate": 0.1, "kinds": ("boom",)}, "fault kinds must be a non-empty subset of"),
        ({"rate": 0.1, "timeout_delay_s": -1.0}, "timeout_delay_s must be >= 0, got -1.0"),
    ],
)
def test_bad_settings_are_one_line_errors(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        inject_faults(BASE, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["env_faults.rate=0.2", "env_faults.kinds=[hang]", "rollout.episode_timeout_s=null"],
            "config: env_faults.kinds contains 'hang', which needs rollout.episode_timeout_s (not null)",
        ),
        (["env_faults.rate=1.5"], "config key 'env_faults.rate': Input should be less than or equal to 1 (got 1.5)"),
        (["env_faults.kinds=[]"], "config key 'env_faults.kinds': Tuple should have at least 1 item after validation"),
        (["rollout.retry_faulted_groups=-1"], "config key 'rollout.retry_faulted_groups': Input should be greater"),
        (["rollout.episode_timeout_s=0"], "config key 'rollout.episode_timeout_s': Input should be greater than 0"),
    ],
)
def test_config_mistakes_are_one_line_errors(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_the_training_loop_injects_per_step_and_only_when_asked() -> None:
    config = load_config(None, ["env_faults.rate=0.2", "env_faults.seed=1"])
    assert with_faults(BASE, load_config(None, []).env_faults, step=3) is BASE
    one, other = with_faults(BASE, config.env_faults, 3), with_faults(BASE, config.env_faults, 4)
    assert isinstance(one, FaultInjector) and isinstance(other, FaultInjector)
    assert (one.rate, one.kinds, one.seed, other.seed) == (0.2, ("tool_timeout", "tool_crash"), 1_000_006, 1_000_007)
