"""bf16 mixed precision (model.precision) and activation checkpointing (model.gradient_checkpointing)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from harmonyrl.config import RLConfig
from harmonyrl.learn.batch import collate, score
from harmonyrl.learn.device import autocast
from harmonyrl.models import grad_checkpointing
from harmonyrl.models.attention import kernel_of, set_kernel
from harmonyrl.models.lora import add_lora, merged_model
from harmonyrl.models.tiny_gpt_oss import build_config, build_model
from harmonyrl.rl.learner import Learner
from harmonyrl.rl.targets import single_pass
from harmonyrl.types import Trajectory

VOCAB = 97
HEAD = tuple(range(1, 41))  # a shared prompt: the trainer's shared-prefix pass applies


def _episodes() -> list[Trajectory]:
    out = []
    for g in range(3):
        for i in range(4):
            gen = torch.Generator().manual_seed(10 * g + i)
            ids = HEAD + tuple(torch.randint(1, VOCAB, (8 + 3 * i,), generator=gen).tolist())
            mask = (0,) * len(HEAD) + (1,) * (8 + 3 * i)
            out.append(Trajectory(f"t{g}", g, ids, mask, (-4.5,) * len(ids), float((g + i) % 2), True, False, None, ()))
    return out


def _model() -> torch.nn.Module:
    return build_model(build_config("nano", VOCAB, 0, 1), seed=0)


@pytest.mark.parametrize("kl_in_reward", [False, True])
def test_bf16_ratio_is_exactly_one_and_loss_is_close_to_fp32(kl_in_reward: bool) -> None:
    # invariant 4 in bf16: old and new log-probs come from the same bf16 forward (single pass), or from a no-grad
    # and a grad bf16 forward of the same weights (two passes, forced by a KL penalty in the reward): ratio 1.0
    cfg = RLConfig(lr=1e-3, kl={"coef": 0.1, "use": "reward"} if kl_in_reward else {})
    results = {}
    for precision in ("fp32", "bf16"):
        learner = Learner.create(cfg, _model(), pad_id=0, norm=64.0, seed=0, precision=precision)
        assert single_pass(cfg, 12, None) == (not kl_in_reward)
        results[precision] = learner.update(_episodes()).metrics
        assert all(p.dtype == torch.float32 for p in learner.model.parameters())  # master weights stay fp32
        assert all(s["exp_avg"].dtype == torch.float32 for s in learner.optimizer.state.values())
    bf16, fp32 = results["bf16"], results["fp32"]
    assert bf16["train/ratio_max_dev_first_mb"] == 0.0
    # at ratio 1 the PPO loss is -mean(advantage) (+ the KL term): equal up to bf16 rounding of the KL
    assert bf16["train/loss"] == pytest.approx(fp32["train/loss"], abs=0.02)
    assert bf16["train/grad_norm"] != fp32["train/grad_norm"]  # bf16 did run: the gradients differ...
    assert bf16["train/grad_norm"] == pytest.approx(fp32["train/grad_norm"], rel=0.05)  # ...by bf16 rounding


def test_autocast_runs_the_forward_in_bf16() -> None:
    model = _model().eval()
    seen: list[torch.dtype] = []
    model.model.layers[0].self_attn.q_proj.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    batch = collate(_episodes()[:2], 0)
    with torch.no_grad(), autocast("bf16", torch.device("cpu")):
        score(model, batch.input_ids, batch.attention_mask)
    assert seen and set(seen) == {torch.bfloat16}


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    batch = collate(_episodes(), 0)
    grad_checkpointing.eval_mode(model)
    scored = score(model, batch.input_ids, batch.attention_mask)
    (-(scored.logprobs * batch.loss_mask).sum()).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("lora", [False, True])
def test_checkpointed_gradients_equal_the_stored_ones(lora: bool) -> None:
    models = [_model(), _model()]
    if lora:
        for m in models:
            add_lora(m, r=4, alpha=8.0, dropout=0.0, targets=("q_proj", "v_proj", "experts"))
            with torch.no_grad():
                for name, p in m.named_parameters():
                    if "lora_B" in name:
                        p.copy_(torch.linspace(-0.1, 0.1, p.numel()).view_as(p))
    grad_checkpointing.enable(models[1])
    calls: list[int] = []
    models[1].model.layers[0].self_attn.register_forward_hook(lambda m, i, o: calls.append(1))
    plain, ckpt = _grads(models[0]), _grads(models[1])
    assert len(calls) == 2  # forward, and again in the backward: checkpointing did recompute the layer
    assert set(plain) == set(ckpt) and plain
    for name in plain:  # the stored run shares the prompt's pass, the checkpointed one cannot: ~1e-7 apart
        torch.testing.assert_close(ckpt[name], plain[name], atol=1e-5, rtol=1e-4, msg=name)


def test_eval_mode_keeps_checkpointing_and_turns_dropout_off() -> None:
    model = _model()
    add_lora(model, r=4, alpha=8.0, dropout=0.5, targets=("q_proj",))
    grad_checkpointing.enable(model)
    grad_checkpointing.eval_mode(model)
    assert grad_checkpointing.active(model)
    dropouts = [m for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    assert dropouts and not any(m.training for m in dropouts)
    with torch.no_grad():
        assert not grad_checkpointing.active(model)  # nothing to recompute without a backward


def _on_policy(update: Callable[[], dict[str, float]]) -> float:
    return update()["train/ratio_max_dev_first_mb"]


def test_rl_update_with_checkpointing_and_lora_in_bf16_is_on_policy() -> None:
    model = _model()
    add_lora(model, r=4, alpha=8.0, dropout=0.0, targets=("q_proj", "k_proj", "v_proj", "o_proj"))
    grad_checkpointing.enable(model)
    learner = Learner.create(RLConfig(lr=1e-2), model, pad_id=0, norm=64.0, seed=0, precision="bf16")
    assert _on_policy(lambda: learner.update(_episodes()).metrics) == 0.0


@pytest.mark.parametrize(("kernel", "chunked"), [("eager", "harmonyrl_eager_chunked"),
    ("harmonyrl_eager", "harmonyrl_eager_thread_chunked"), ("harmonyrl_sink_sdpa", "harmonyrl_sink_sdpa")])  # fmt: skip
def test_checkpointing_runs_an_eager_kernel_in_query_chunks(kernel: str, chunked: str) -> None:
    # the recomputed layer's [B, H, T, T + 1] eager scores were the checkpointed update's peak (docs/memory.md)
    model = _model()
    set_kernel(model, kernel)
    grad_checkpointing.enable(model)
    assert kernel_of(model) == chunked
    add_lora(model, r=4, alpha=8.0, dropout=0.0, targets=("q_proj",))
    assert kernel_of(merged_model(model)) == chunked  # the reference model / engine copy keeps it


def test_checkpointed_two_pass_update_is_on_policy() -> None:
    # a KL penalty in the reward forces a no-grad pass (prompt shared, KV cache) before the checkpointed gradient
    # pass (no cache): both run the chunked kernel, so the first minibatch's ratio is exactly 1
    model = _model()
    grad_checkpointing.enable(model)
    cfg = RLConfig(lr=1e-3, kl={"coef": 0.1, "use": "reward"})
    assert not single_pass(cfg, 12, None)
    learner = Learner.create(cfg, model, pad_id=0, norm=64.0, seed=0)
    assert _on_policy(lambda: learner.update(_episodes()).metrics) == 0.0
