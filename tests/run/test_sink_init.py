"""``model.sink_init`` reaches the trainer's fresh model, and leaving it unset changes nothing."""

from __future__ import annotations

import torch

from harmonyrl.config import load_config
from harmonyrl.harmony.codecs import load_codec
from harmonyrl.run.setup import make_model


def test_sink_init_sets_every_sink_and_default_is_untouched() -> None:
    default = load_config(None, ["model.preset=nano"])
    tok = load_codec(default.model.tokenizer)
    plain = make_model(default, tok)
    again = make_model(default, tok)
    for a, b in zip(plain.state_dict().values(), again.state_dict().values(), strict=True):
        assert torch.equal(a, b)  # the default build is what it was: seeded, no sink edit
    assert float(plain.model.layers[0].self_attn.sinks.detach().abs().max()) < 0.2  # transformers' N(0, 0.02)
    large = make_model(load_config(None, ["model.preset=nano", "model.sink_init=5"]), tok)
    for layer in large.model.layers:
        assert torch.equal(layer.self_attn.sinks.detach(), torch.full_like(layer.self_attn.sinks, 5.0))
    others = [(k, v) for k, v in large.state_dict().items() if not k.endswith("sinks")]
    for k, v in others:  # nothing but the sinks differs from the default build
        assert torch.equal(v, plain.state_dict()[k]), k
