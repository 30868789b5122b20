"""Every named algorithm, selected through the typed config, trains in the right direction; guards roll back."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from harmonyrl.config import RLConfig
from harmonyrl.jobs.compare import algorithm_names, named_algorithm
from harmonyrl.learn.batch import collate, score
from harmonyrl.models.tiny_gpt_oss import build_config, build_model
from harmonyrl.rl.learner import Learner
from harmonyrl.rl.soft_q import SoftQLearning
from harmonyrl.types import Failure, Trajectory

ALGORITHMS = {name: named_algorithm(name).model_dump(exclude_none=True) for name in algorithm_names()}
"""Every algorithm preset (presets/algorithms/*.yaml) as the ``rl`` fragment ``harmonyrl compare`` applies."""
VOCAB = 97
HEAD = tuple(range(1, 41))  # a shared 40-token prompt (the env's system + developer messages)


def _traj(group: int, reward: float, n: int, seed: int) -> Trajectory:
    gen = torch.Generator().manual_seed(seed)
    ids = HEAD + tuple(torch.randint(1, VOCAB, (n,), generator=gen).tolist())
    mask = (0,) * len(HEAD) + (1,) * n
    return Trajectory(f"t{group}", group, ids, mask, (-4.5,) * len(ids), reward, True, False, None, (), 0, {})


def _episodes() -> list[Trajectory]:
    # 3 groups of 4, half rewarded in each (every group has signal), different lengths
    return [_traj(g, float((g + i) % 2), 8 + 3 * i, 10 * g + i) for g in range(3) for i in range(4)]


def _learner(fragment: dict, **overrides: object) -> Learner:
    cfg = RLConfig.model_validate({**fragment, "lr": 1e-2, **overrides})
    model = build_model(build_config("nano", VOCAB, 0, 1), seed=0)
    return Learner.create(cfg, model, pad_id=0, norm=64.0, seed=0)


def _seq_logp(model: torch.nn.Module, trajs: list[Trajectory]) -> torch.Tensor:
    batch = collate(trajs, 0)
    with torch.no_grad():
        lp = score(model.eval(), batch.input_ids, batch.attention_mask).logprobs
    return (lp * batch.loss_mask).sum(1)


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_named_algorithm_makes_rewarded_episodes_more_likely(name: str) -> None:
    learner = _learner(ALGORITHMS[name])
    trajs = _episodes()
    before = _seq_logp(learner.model, trajs)
    for _ in range(3):
        update = learner.update(trajs)
        assert update.applied and update.skip_reason is None
        assert update.metrics["guard/skipped"] == 0.0 and update.metrics["train/skipped"] == 0.0
    gain = _seq_logp(learner.model, trajs) - before
    rewarded = torch.tensor([t.reward > 0 for t in trajs])
    assert gain[rewarded].mean() > gain[~rewarded].mean() + 0.05, (name, gain)


def test_first_update_is_exactly_on_policy_with_a_critic() -> None:
    learner = _learner(ALGORITHMS["ppo"])
    metrics = learner.update(_episodes()).metrics
    assert metrics["train/ratio_max_dev_first_mb"] == 0.0 and metrics["train/value_loss"] > 0


def test_value_head_learns_the_returns() -> None:
    learner = _learner(ALGORITHMS["ppo"], epochs=1)
    trajs = _episodes()
    losses = [learner.update(trajs).metrics["train/value_loss"] for _ in range(8)]
    assert losses[-1] < 0.7 * losses[0]  # measured: 0.148 → 0.084 in 8 updates


def _params(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("name", ["grpo", "ppo", "sac"])
def test_grad_norm_guard_rolls_the_step_back(name: str) -> None:
    learner = _learner(ALGORITHMS[name], guards={"max_grad_norm": 1e-9}, epochs=2, minibatches=2)
    before = _params(learner.model)
    opt_before = {k: dict(v) for k, v in learner.optimizer.state_dict()["state"].items()}
    update = learner.update(_episodes())
    assert not update.applied and update.skip_reason == "guard"
    assert update.metrics["guard/skipped"] == 1.0 and update.metrics["guard/trip_grad_norm"] == 1.0
    assert all(torch.equal(a, b) for a, b in zip(before, _params(learner.model), strict=True))
    assert learner.optimizer.state_dict()["state"].keys() == opt_before.keys()  # no Adam moments were taken


def test_nan_reward_is_skipped_not_applied() -> None:
    learner = _learner(ALGORITHMS["ppo"])
    trajs = [dataclasses.replace(t, reward=float("nan")) if i == 0 else t for i, t in enumerate(_episodes())]
    before = _params(learner.model)
    metrics = learner.update(trajs).metrics
    assert metrics["guard/skipped"] == 1.0 and metrics["guard/trip_nonfinite_loss"] == 1.0
    assert all(torch.equal(a, b) for a, b in zip(before, _params(learner.model), strict=True))


def test_entropy_guard_trips_on_a_peaked_policy() -> None:
    learner = _learner(ALGORITHMS["grpo"], guards={"min_entropy": 50.0})  # above log(97): always trips
    metrics = learner.update(_episodes()).metrics
    assert metrics["guard/skipped"] == 1.0 and metrics["guard/trip_entropy_low"] == 1.0


def test_kl_guard_uses_the_live_kl_to_the_reference() -> None:
    learner = _learner(ALGORITHMS["grpo"], guards={"max_kl": 1e-12}, epochs=3)
    before = _params(learner.model)
    metrics = learner.update(_episodes()).metrics  # the 2nd epoch already differs from the reference
    assert metrics["guard/skipped"] == 1.0 and metrics["guard/trip_kl"] == 1.0
    # the 1st epoch's update was applied before the trip: the snapshot must undo it
    assert all(torch.equal(a, b) for a, b in zip(before, _params(learner.model), strict=True))


def test_soft_q_replays_old_episodes_and_its_target_network_follows_by_polyak() -> None:
    learner = _learner(ALGORITHMS["sac"], loss={"kind": "soft_q", "replay_batch": 8, "tau": 0.25})
    assert isinstance(learner.rule, SoftQLearning) and learner.rule.value_head is not None
    trajs = _episodes()
    learner.update(trajs[:6])
    # both heads start at zero, so after one update V̄ = 0.75 · 0 + 0.25 · V exactly
    online, target = learner.rule.value_head.proj.weight.detach(), learner.rule.state.target_head.proj.weight
    assert float(online.abs().sum()) > 0 and torch.allclose(target, 0.25 * online)
    metrics = learner.update(trajs[6:]).metrics
    assert metrics["replay/size"] == 12.0
    assert metrics["train/kl_ref_k3"] > 0  # the first update moved π away from the warm start
    assert not learner.rule.state.target_head.proj.weight.requires_grad


def test_soft_q_critic_learns_in_its_own_optimizer_group() -> None:
    learner = _learner(ALGORITHMS["sac"], loss={"kind": "soft_q", "critic_lr": 0.5})
    assert learner.rule.value_head is not None
    groups = learner.optimizer.param_groups
    assert [g["lr"] for g in groups] == [1e-2, 0.5]
    assert groups[1]["params"] == list(learner.rule.value_head.parameters())


def test_kl_as_reward_and_as_loss_both_run_and_report() -> None:
    for use in ("loss", "reward"):
        learner = _learner(ALGORITHMS["reinforce_pp"], kl={"coef": 0.1, "use": use}, epochs=2)
        metrics = learner.update(_episodes()).metrics
        assert metrics["train/kl_ref_live_k3"] > 0 and metrics["guard/skipped"] == 0.0


def test_rejection_correction_removes_mismatched_tokens() -> None:
    # sampler log-probs of -4.5 vs a near-uniform nano model (log 1/97 ≈ -4.57): a tight threshold rejects
    learner = _learner(ALGORITHMS["grpo"], correction={"rejection": {"level": "sequence", "threshold": 1e-6}})
    metrics = learner.update(_episodes()).metrics
    assert metrics["mismatch/rejected_seq_fraction"] == 1.0


@pytest.mark.parametrize("name", ["grpo", "sac"])
def test_nothing_trainable_is_a_typed_skip_that_changes_nothing(name: str) -> None:
    # grpo: every group rewarded alike (all dropped as zero-variance); sac: every episode failed, buffer empty
    learner = _learner(ALGORITHMS[name])
    same = [dataclasses.replace(t, reward=1.0) for t in _episodes()]
    failed = [dataclasses.replace(t, failure=Failure("tool_crash", "boom")) for t in _episodes()]
    before = _params(learner.model)
    update = learner.update(same if name == "grpo" else failed)
    assert not update.applied and update.skip_reason == "nothing_trainable"
    assert update.metrics["train/skipped"] == 1.0 and "guard/skipped" not in update.metrics
    assert all(torch.equal(a, b) for a, b in zip(before, _params(learner.model), strict=True))


def test_micro_batch_bounds_the_pass_not_what_is_learnt() -> None:
    """``rl.micro_batch=1``: one episode a pass, gradients accumulated; the update matches 32 rows a pass to
    rounding, and the first pass's PPO ratio is still exactly 1 (invariant 4: same slicing in every pass). AdamW's
    first step is about ±lr per weight whatever the gradient's size, so the weights agree to a fraction of lr (1e-2)."""
    results = []
    for rows in (32, 1):
        learner = _learner(ALGORITHMS["grpo"], micro_batch=rows)
        update = learner.update(_episodes())
        assert update.applied and update.metrics["train/ratio_max_dev_first_mb"] == 0.0
        results.append((update.metrics, _params(learner.model)))
    (m32, params_32), (m1, params_1) = results
    assert (
        abs(m32["train/loss"] - m1["train/loss"]) < 1e-6 and abs(m32["train/grad_norm"] - m1["train/grad_norm"]) < 1e-4
    )
    assert max((a - b).abs().max().item() for a, b in zip(params_32, params_1, strict=True)) < 1e-3
