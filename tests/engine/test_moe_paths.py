"""The engine's two MoE paths against the ``mlp`` module the trainer runs: same routing, same outputs."""

from __future__ import annotations

import pytest
import torch

from harmonyrl.engine.local.moe import DenseExperts, SplitExperts, dense_moe, sparse_moe
from harmonyrl.models.tiny_gpt_oss import build_config, build_model


@pytest.fixture(scope="module")
def mlp() -> torch.nn.Module:
    model = build_model(build_config("micro", 300, pad_token_id=0, eos_token_id=1), seed=0).eval()
    with torch.no_grad():  # large biases push some activations past the SwiGLU clamp (limit 7)
        model.model.layers[1].mlp.experts.gate_up_proj_bias.normal_(0, 6.0)
    return model.model.layers[1].mlp


@pytest.mark.parametrize("n", [1, 3, 64, 700])
def test_sparse_moe_is_the_mlp_module_bit_for_bit(mlp: torch.nn.Module, n: int) -> None:
    x = torch.randn(n, mlp.router.weight.shape[1], generator=torch.Generator().manual_seed(n))
    with torch.inference_mode():
        want, _ = mlp(x[None])
        got = sparse_moe(mlp, SplitExperts.of(mlp.experts), x)
    assert torch.equal(got, want[0])


def test_sparse_moe_with_an_expert_that_gets_no_token(mlp: torch.nn.Module) -> None:
    x = torch.randn(1, mlp.router.weight.shape[1], generator=torch.Generator().manual_seed(7))
    x = x.expand(5, -1).contiguous()  # five copies of one token: top-2 of 4 leaves two experts idle
    with torch.inference_mode():
        want, _ = mlp(x[None])
        got = sparse_moe(mlp, SplitExperts.of(mlp.experts), x)
    assert torch.equal(got, want[0])


def test_split_experts_put_gate_columns_first(mlp: torch.nn.Module) -> None:
    split = SplitExperts.of(mlp.experts)
    w = mlp.experts.gate_up_proj.detach()
    half = w.shape[2] // 2
    assert torch.equal(split.w1[:, :, :half], w[:, :, 0::2]) and torch.equal(split.w1[:, :, half:], w[:, :, 1::2])


def test_dense_moe_matches_the_mlp_module(mlp: torch.nn.Module) -> None:
    x = torch.randn(32, mlp.router.weight.shape[1], generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        want, _ = mlp(x[None])
        got = dense_moe(mlp, DenseExperts.of(mlp.experts), x)
    assert torch.allclose(got, want[0], atol=1e-5, rtol=1e-5)  # all experts summed densely: fp32 order only
