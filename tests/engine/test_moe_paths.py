"""The engine's MoE against the ``mlp`` module the trainer runs: same routing, same outputs, routed experts only."""

from __future__ import annotations

import pytest
import torch

from harmonyrl.engine.local.moe import routed_moe
from harmonyrl.models.tiny_gpt_oss import build_config, build_model


@pytest.fixture(scope="module")
def mlp() -> torch.nn.Module:
    model = build_model(build_config("micro", 300, pad_token_id=0, eos_token_id=1), seed=0).eval()
    with torch.no_grad():  # large biases push some activations past the SwiGLU clamp (limit 7)
        model.model.layers[1].mlp.experts.gate_up_proj_bias.normal_(0, 6.0)
    return model.model.layers[1].mlp


@pytest.mark.parametrize("n", [1, 3, 32, 64, 700])
def test_routed_moe_is_the_mlp_module_bit_for_bit(mlp: torch.nn.Module, n: int) -> None:
    x = torch.randn(n, mlp.router.weight.shape[1], generator=torch.Generator().manual_seed(n))
    with torch.inference_mode():
        want, _ = mlp(x[None])
        got = routed_moe(mlp, x)
    assert torch.equal(got, want[0])


def test_routed_moe_with_an_expert_that_gets_no_token(mlp: torch.nn.Module) -> None:
    x = torch.randn(1, mlp.router.weight.shape[1], generator=torch.Generator().manual_seed(7))
    x = x.expand(5, -1).contiguous()  # five copies of one token: top-2 of 4 leaves two experts idle
    with torch.inference_mode():
        want, _ = mlp(x[None])
        got = routed_moe(mlp, x)
    assert torch.equal(got, want[0])


def test_routed_moe_never_touches_an_expert_no_token_chose(mlp: torch.nn.Module) -> None:
    """Decode computes only the routed experts: poison the experts no token picked and the output is unchanged."""
    x = torch.randn(1, mlp.router.weight.shape[1], generator=torch.Generator().manual_seed(7)).expand(3, -1)
    with torch.inference_mode():
        _, _, idx = mlp.router(x)
        want = routed_moe(mlp, x)
    idle = sorted(set(range(mlp.experts.gate_up_proj.shape[0])) - set(idx.flatten().tolist()))
    assert idle
    saved = mlp.experts.gate_up_proj.detach()[idle].clone()
    with torch.no_grad():
        mlp.experts.gate_up_proj[idle] = float("nan")
    try:
        with torch.inference_mode():
            assert torch.equal(routed_moe(mlp, x), want)
    finally:
        with torch.no_grad():
            mlp.experts.gate_up_proj[idle] = saved
