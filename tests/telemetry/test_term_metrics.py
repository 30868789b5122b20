"""Each reward term the env reports becomes a step metric (``rollout/terms/<name>``, ``eval/terms/<name>``)."""

from __future__ import annotations

from harmonyrl.telemetry.metrics import summarize_rollouts
from harmonyrl.types import ROLE_TERM, Failure, Trajectory


def episode(terms: dict[str, float], failure: Failure | None = None) -> Trajectory:
    return Trajectory(task_id="t", group_id=0, token_ids=(1, 2), loss_mask=(0, 1), sampler_logprobs=(0.0, -1.0),
                      reward=terms.get("reward/correct", 0.0), terminated=True, truncated=False, failure=failure,
                      turns=(), reward_terms=terms)  # fmt: skip


def test_each_term_is_averaged_over_the_episodes_without_a_fault_a_missing_one_counting_0() -> None:
    trajs = [
        episode({"reward/correct": 1.0, "metric/took_smaller": 0.0, ROLE_TERM: 1.0}),
        episode({"reward/correct": 0.0, "metric/took_smaller": 1.0, ROLE_TERM: 0.0}),
        episode({"reward/correct": 1.0}),  # no took_smaller: counts 0
        episode({}),  # cut short before the env scored it
        episode({"reward/correct": 1.0, "metric/took_smaller": 1.0}, Failure("tool_timeout", "x")),  # left out
    ]
    out = summarize_rollouts(trajs, prefix="eval")
    assert out["eval/terms/reward/correct"] == 2 / 4 and out["eval/terms/metric/took_smaller"] == 1 / 4
    assert not any(ROLE_TERM in k for k in out)
    assert not any("/terms/" in k for k in summarize_rollouts([episode({})]))
