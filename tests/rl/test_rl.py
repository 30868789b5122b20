import dataclasses
from collections.abc import Callable

import pytest
import torch

from harmonyrl.algorithms.choices import GRPO
from harmonyrl.algorithms.correction import RolloutCorrectionConfig, TruncatedIS
from harmonyrl.config import RLConfig
from harmonyrl.learn.batch import collate, score
from harmonyrl.models.tiny_gpt_oss import build_config, build_model
from harmonyrl.rl import targets as rl_targets
from harmonyrl.rl.reference import Reference
from harmonyrl.rl.targets import prepare, single_pass, token_advantages
from harmonyrl.rl.update import rl_update
from harmonyrl.types import Failure, Trajectory

VOCAB = 97


def _traj(group: int, reward: float, length: int, prompt: int, seed: int, failure: Failure | None = None) -> Trajectory:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (length,), generator=g).tolist()
    mask = [0] * prompt + [1] * (length - prompt)
    return Trajectory(
        f"t{group}", group, tuple(ids), tuple(mask), tuple([-1.0] * length), reward, True, False, failure, ()
    )


def _batch() -> list[Trajectory]:
    # groups with mixed rewards and different lengths (padding), plus one env failure
    return [
        _traj(0, 1.0, 30, 10, 1),
        _traj(0, 0.0, 22, 10, 2),
        _traj(0, 0.0, 41, 10, 3),
        _traj(1, 0.0, 25, 12, 4),
        _traj(1, 1.0, 37, 12, 5),
        _traj(2, 1.0, 20, 8, 6),
        _traj(2, 1.0, 28, 8, 7),  # zero-variance group
        _traj(1, 1.0, 33, 12, 8, Failure("tool_timeout", "slow")),
    ]


def _shared_prefix_batch() -> list[Trajectory]:
    """Like :func:`_batch`, but every episode starts with the same 40 tokens (an env's system + developer
    messages), so scoring takes the shared-prefix path."""
    head = _traj(9, 0.0, 40, 40, 99).token_ids
    return [
        Trajectory(
            t.task_id,
            t.group_id,
            head + t.token_ids,
            (0,) * 40 + t.loss_mask,
            (-1.0,) * 40 + t.sampler_logprobs,
            t.reward,
            True,
            False,
            t.failure,
            (),
        )
        for t in _batch()
    ]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(build_config("nano", VOCAB, 0, 1), seed=0)


def test_failures_and_zero_variance_groups_are_dropped() -> None:
    prepared = prepare(_batch(), RLConfig(), pad_id=0)
    assert prepared is not None
    assert prepared.n_failed == 1 and prepared.n_dropped_zero_var == 2
    assert prepared.batch.size == 5
    # the timed-out episode (reward 1) did not enter group 1's statistics: group 1 is {0, 1}
    adv, _ = token_advantages(GRPO(), prepared.batch, torch.zeros_like(prepared.batch.loss_mask), None)
    assert torch.allclose(adv[3:].abs().max(1).values, torch.tensor([0.7071, 0.7071]), atol=1e-3)
    assert adv[3].min() < 0 < adv[4].max()


def test_failed_episode_has_zero_loss_mask() -> None:
    batch = collate(_batch(), pad_id=0)
    assert batch.loss_mask[-1].sum() == 0 and batch.loss_mask[0].sum() > 0


@pytest.mark.parametrize("epochs", [1, 2])
@pytest.mark.parametrize("make_batch", [_batch, _shared_prefix_batch])
def test_on_policy_ratio_is_exactly_one_on_moe_model(make_batch: Callable[[], list[Trajectory]], epochs: int) -> None:
    # invariant 4: the first forward's ratio is 1.0 bit for bit (MoE included); with 2 epochs the old log-probs
    # come from a separate no-grad pass, with 1 from the update's own pass (``single_pass``)
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    cfg = RLConfig(epochs=epochs, minibatches=1)
    prepared = prepare(make_batch(), cfg, pad_id=0)
    assert prepared is not None
    assert single_pass(cfg, prepared.batch.size, None) == (epochs == 1)
    metrics = rl_update(model, opt, prepared, cfg, ref_model=None).metrics
    assert metrics["train/ratio_max_dev_first_mb"] == 0.0
    assert metrics["train/grad_norm"] > 0
    if epochs == 1:  # a second epoch runs after an update: its ratios may clip
        assert metrics["train/clip_fraction"] == 0.0


def test_no_grad_and_grad_forward_are_bitwise_equal() -> None:
    model = _model().eval()
    b = collate(_batch(), pad_id=0)
    with torch.no_grad():
        a = score(model, b.input_ids, b.attention_mask).logprobs
    c = score(model, b.input_ids, b.attention_mask).logprobs
    assert torch.equal(a, c.detach())


def test_second_epoch_moves_ratio_and_update_changes_policy() -> None:
    model = _model()
    cfg = RLConfig(epochs=2, minibatches=2, lr=1e-2)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    prepared = prepare(_batch(), cfg, pad_id=0)
    assert prepared is not None
    before = score(model.eval(), prepared.batch.input_ids, prepared.batch.attention_mask).logprobs.detach()
    rl_update(model, opt, prepared, cfg, ref_model=None)
    after = score(model, prepared.batch.input_ids, prepared.batch.attention_mask).logprobs.detach()
    m = prepared.batch.loss_mask.bool()
    assert not torch.equal(before[m], after[m])
    # positive-advantage episodes became more likely on average, negative ones less
    gain = ((after - before) * prepared.batch.loss_mask).sum(1)
    episode_adv = prepared.batch.rewards - 0.5  # every kept group is mixed 0/1: sign of the GRPO advantage
    pos, neg = episode_adv > 0, episode_adv < 0
    assert gain[pos].mean() > gain[neg].mean()


def test_entropy_bonus_raises_entropy() -> None:
    # zero advantages: the only force is the entropy bonus, which must raise the policy's entropy
    from harmonyrl.rl.targets import Prepared
    from harmonyrl.sft.train import Demo, sft_step

    model = _model()
    trajs = _batch()[:5]
    sharpen = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(15):  # a fresh model is near-uniform (max entropy); make it peaked first
        sft_step(model, sharpen, [Demo(t.token_ids, t.loss_mask) for t in trajs], pad_id=0)
    batch = collate([dataclasses.replace(t, group_id=i) for i, t in enumerate(trajs)], pad_id=0)
    prepared = Prepared(batch, 0, 0)  # every episode its own group of one: GRPO advantages are all 0
    cfg = RLConfig(entropy_coef=1.0, lr=1e-2)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    m = batch.loss_mask.bool()
    before = score(model.eval(), batch.input_ids, batch.attention_mask).entropy[m].mean()
    for _ in range(3):
        rl_update(model, opt, prepared, cfg, ref_model=None)
    after = score(model, batch.input_ids, batch.attention_mask).entropy[m].mean()
    assert before < 4.0 and after > before + 0.05


def test_sampler_trainer_gap_is_reported() -> None:
    # invariant 3: both log-prob streams are carried; k1 mismatch = mean over sampled tokens of (sampler - trainer)
    model = _model()
    prepared = prepare(_batch(), RLConfig(), pad_id=0)
    assert prepared is not None
    b = prepared.batch
    with torch.no_grad():
        trainer = score(model.eval(), b.input_ids, b.attention_mask).logprobs
    m = b.loss_mask.bool()
    expected = float((b.sampler_logprobs - trainer)[m].mean())
    metrics = rl_update(model, torch.optim.AdamW(model.parameters()), prepared, RLConfig(), ref_model=None).metrics
    assert abs(metrics["mismatch/kl_k1"] - expected) < 1e-4
    assert metrics["mismatch/kl_k3"] > 0


def test_score_entropy_has_gradient_only_when_asked() -> None:
    model = _model()
    b = collate(_batch()[:2], pad_id=0)
    assert not score(model, b.input_ids, b.attention_mask).entropy.requires_grad
    ent = score(model, b.input_ids, b.attention_mask, entropy_grad=True).entropy
    assert ent.requires_grad
    ent.sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


@pytest.mark.parametrize("make_batch", [_batch, _shared_prefix_batch])
def test_single_pass_update_equals_the_two_pass_update(
    make_batch: Callable[[], list[Trajectory]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # skipping the no-grad old-policy pass must change nothing: same weights after the step, same metrics
    cfg = RLConfig(epochs=1, minibatches=1, entropy_coef=0.01)
    results = []
    for single in (True, False):
        monkeypatch.setattr(rl_targets, "single_pass", lambda *_, s=single: s)
        model, ref = _model(), _model().eval()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        prepared = prepare(make_batch(), cfg, pad_id=0)
        assert prepared is not None
        results.append((rl_update(model, opt, prepared, cfg, ref_model=Reference(ref)).metrics, model.state_dict()))
    (m1, w1), (m2, w2) = results
    assert m1 == m2 and "mismatch/kl_k1" in m1 and "routing/load_cv" in m1
    assert all(torch.equal(w1[k], w2[k]) for k in w1)
    assert any(not torch.equal(w1[k], _model().state_dict()[k]) for k in w1)  # the step did move the weights


def test_single_pass_only_when_nothing_reads_old_logprobs_before_the_update() -> None:
    assert single_pass(RLConfig(), 8, None)
    assert not single_pass(RLConfig(minibatches=2), 8, None)
    assert single_pass(RLConfig(minibatches=2), 1, None)  # one episode is one minibatch
    assert not single_pass(RLConfig(), 8, torch.nn.Linear(2, 1))  # critic values feed the advantages
    assert not single_pass(RLConfig(correction=RolloutCorrectionConfig(weights=TruncatedIS())), 8, None)
    assert not single_pass(RLConfig(routing_replay="r2"), 8, None)
