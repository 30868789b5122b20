"""The staleness-aware step (``rl.async.lr_decay``): the update at k > 0 is the update at rl.lr / (1 + decay·k),
bit for bit, and the configured rate is back in the optimizer afterwards; off, nothing is touched."""

from __future__ import annotations

import torch

from harmonyrl.config import RLConfig
from harmonyrl.learn.optimizer_step import scaled_lr
from harmonyrl.models.tiny_gpt_oss import build_config, build_model
from harmonyrl.rl.targets import prepare
from harmonyrl.rl.update import rl_update
from harmonyrl.types import Trajectory

VOCAB = 97


def _traj(group: int, reward: float, length: int, seed: int) -> Trajectory:
    ids = torch.randint(1, VOCAB, (length,), generator=torch.Generator().manual_seed(seed)).tolist()
    mask = [0] * 8 + [1] * (length - 8)
    logprobs = tuple([-1.0] * length)
    return Trajectory(f"t{group}", group, tuple(ids), tuple(mask), logprobs, reward, True, False, None, ())


def _batch() -> list[Trajectory]:
    return [_traj(0, 1.0, 30, 1), _traj(0, 0.0, 22, 2), _traj(1, 0.0, 25, 3), _traj(1, 1.0, 37, 4)]


def test_scaled_lr_scales_inside_and_restores_after() -> None:
    # SGD, p = 1, grad = 1, lr 0.25 × 0.5 → p = 1 - 0.125 = 0.875 (exact in float32); lr 0.25 again afterwards
    p = torch.nn.Parameter(torch.tensor([1.0]))
    opt = torch.optim.SGD([p], lr=0.25)
    p.grad = torch.tensor([1.0])
    with scaled_lr(opt, 0.5):
        assert opt.param_groups[0]["lr"] == 0.125
        opt.step()
    assert float(p.detach()) == 0.875 and opt.param_groups[0]["lr"] == 0.25


def _update(lr: float, async_: dict[str, float]) -> tuple[dict[str, torch.Tensor], dict[str, float], float]:
    torch.manual_seed(0)
    model = build_model(build_config("nano", VOCAB, 0, 1), seed=0)
    cfg = RLConfig.model_validate({"lr": 1e-3, "async": async_})
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    prepared = prepare(_batch(), cfg, pad_id=0)
    assert prepared is not None
    metrics = rl_update(model, opt, prepared, cfg, ref_model=None).metrics
    return model.state_dict(), metrics, opt.param_groups[0]["lr"]


def test_stale_update_is_the_update_at_the_scaled_rate() -> None:
    # k = 2, decay 0.5: lr × 1 / (1 + 0.5·2) = lr / 2 — the same weights as a synchronous update at 5e-4
    stale, metrics, lr_after = _update(1e-3, {"max_staleness": 2, "lr_decay": 0.5})
    halved, sync_metrics, _ = _update(5e-4, {})
    full, _, _ = _update(1e-3, {})
    assert all(torch.equal(stale[k], halved[k]) for k in stale)
    assert any(not torch.equal(stale[k], full[k]) for k in stale)  # the scale did change the step
    assert metrics["async/lr_scale"] == 0.5 and lr_after == 1e-3
    assert "async/lr_scale" not in sync_metrics  # k = 0 keeps today's keys


def test_decay_zero_is_todays_update() -> None:
    off, metrics, _ = _update(1e-3, {"max_staleness": 1})
    full, _, _ = _update(1e-3, {})
    assert all(torch.equal(off[k], full[k]) for k in off) and metrics["async/lr_scale"] == 1.0
