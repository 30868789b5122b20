"""The tests' MXFP4 encoder against transformers' decoder (``convert_moe_packed_tensors``, which the loader uses):
values on the E2M1 grid survive the round trip exactly, any other value within MXFP4's rounding error."""

from __future__ import annotations

import torch
from ckpt_writers import E2M1, block_exponents, mxfp4_encode
from transformers.integrations.mxfp4 import convert_moe_packed_tensors


def _decode(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)  # [E, In, Out]


def test_layout_of_one_hand_made_block() -> None:
    # one expert, In = 32 (one block), Out = 1: values 0.5·[0, 1, 2, ..., 6, -6] -> scale 2**-1 after amax 3 / 6
    values = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0] + [0.0] * 25 + [-3.0]).reshape(1, 32, 1)
    blocks, scales = mxfp4_encode(values)
    assert blocks.shape == (1, 1, 1, 16) and scales.shape == (1, 1, 1)
    assert scales.item() == 127 - 1  # amax 3 = 6 · 2**-1
    # element 2i in the low nibble, 2i+1 in the high: (0 -> code 0, 0.5 -> code 2 i.e. 1.0·2**-1) = 0x20
    assert blocks[0, 0, 0, 0].item() == 0x20
    assert blocks[0, 0, 0, 15].item() == (8 + 7) << 4  # -3 = -6 · 2**-1: sign bit + code 7, high nibble
    assert torch.equal(_decode(blocks, scales), values)


def test_values_on_the_e2m1_grid_round_trip_exactly() -> None:
    gen = torch.Generator().manual_seed(0)
    experts, fan_in, fan_out = 3, 96, 10
    codes = torch.randint(0, 16, (experts, fan_out, fan_in), generator=gen)
    signs = 1 - 2 * (codes >= 8).float()
    exps = torch.randint(-20, 5, (experts, fan_out, fan_in // 32), generator=gen).repeat_interleave(32, -1)
    values = (signs * E2M1[codes % 8] * torch.exp2(exps.float())).transpose(1, 2).contiguous()  # [E, In, Out]
    assert torch.equal(_decode(*mxfp4_encode(values)), values)


def test_rounding_error_is_within_the_mxfp4_bound() -> None:
    """Bound, derived: the block scale is s = 2**ceil(log2(amax/6)), so |w|/s <= 6. E2M1 spacing is 0.5 on
    [0, 2], 1 on [2, 4], 2 on [4, 6]; rounding to nearest errs by at most half of it: 0.25·s on [0, 1), and on
    [1, 6] at most |w|/4 (0.25 s <= |w|/4 on [1, 2), 0.5 s on [2, 4), 1 s on [4, 6]). So
    |deq(w) - w| <= max(|w|, s) / 4, element by element."""
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(4, 128, 64, generator=gen) * 0.02
    weight[0, :32, 0] *= 1000  # one block of large values beside small ones
    deq = _decode(*mxfp4_encode(weight))
    s = torch.exp2(block_exponents(weight).float()).repeat_interleave(32, -1).transpose(1, 2)  # [E, In, Out]
    bound = torch.maximum(weight.abs(), s) / 4
    err = (deq - weight).abs()
    assert torch.all(err <= bound)
    assert (err / bound).max() > 0.9  # the bound is reached: rounding really happened
    assert not torch.equal(deq, weight)
