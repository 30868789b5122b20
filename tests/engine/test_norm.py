"""The engine's RMSNorm (prefill, prefix and decode all use it) is the model's own, bit for bit."""

import pytest
import torch

from harmonyrl.engine.local.forward import _rms
from harmonyrl.models.tiny_gpt_oss import build_config, build_model


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_is_the_hf_norm_module(dtype: torch.dtype) -> None:
    model = build_model(build_config("micro", 97, 0, 1), seed=0).eval()
    norm = model.model.layers[0].input_layernorm
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(norm.weight.shape, generator=gen))  # not all ones: the weight must count
        x = (torch.randn(4, 37, norm.weight.shape[0], generator=gen) * 3).to(dtype)
        assert torch.equal(_rms(x, norm.weight.float(), norm.variance_epsilon), norm(x))
