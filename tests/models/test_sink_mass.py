"""Sink attention mass: the pure formula against hand-derived values, and the per-layer measurement of a model
whose key logits are all 0 (so every visible key has weight 1 and the sink share is ``e^s / (e^s + n)``)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from harmonyrl.config import load_config
from harmonyrl.models.sinks import mass_from_weights, mean_over_queries, set_sinks, sink_mass, sink_mass_by_layer
from harmonyrl.models.tiny_gpt_oss import build_config, build_model

VOCAB = 97


def test_sink_mass_by_hand() -> None:
    # one head, sink logit ln 2 (e^s = 2); query 0 sees keys with logits 0, 0: 2 / (2 + 1 + 1) = 0.5;
    # query 1 sees only key 0 (logit ln 3, e = 3): 2 / (2 + 3) = 0.4; query 2 sees nothing: all mass on the sink
    logits = torch.tensor([[[[0.0, 0.0], [math.log(3.0), 5.0], [1.0, 1.0]]]])
    keep = torch.tensor([[[[True, True], [True, False], [False, False]]]])
    got = sink_mass(logits, torch.tensor([math.log(2.0)]), keep)
    torch.testing.assert_close(got, torch.tensor([[[0.5, 0.4, 1.0]]]))


def test_mass_from_weights_and_mean() -> None:
    # weights rows sum to 0.75 and 0.5 → sink shares 0.25 and 0.5; the padded third query is left out
    weights = torch.tensor([[[[0.5, 0.25], [0.25, 0.25], [0.0, 0.0]]]])
    mass = mass_from_weights(weights)
    torch.testing.assert_close(mass, torch.tensor([[[0.25, 0.5, 1.0]]], dtype=torch.float64))
    mean = mean_over_queries(mass, torch.tensor([[1, 1, 0]]))
    torch.testing.assert_close(mean, torch.tensor([0.375], dtype=torch.float64))


def test_sink_mass_by_layer_zero_queries() -> None:
    # with q_proj = 0 every key logit is 0: query t sees n_t keys (t + 1 on a full layer, min(t + 1, window) on a
    # sliding one) and gives the sink e^s / (e^s + n_t); the layer's mean is over the T queries
    config = build_config("nano", VOCAB, 0, 1)
    model = build_model(config, seed=0)
    set_sinks(model, 2.0)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.zero_()
            layer.self_attn.q_proj.bias.zero_()
    t, window = 48, int(config.sliding_window)
    ids = torch.randint(2, VOCAB, (1, t), generator=torch.Generator().manual_seed(0))
    got = sink_mass_by_layer(model, ids, torch.ones(1, t, dtype=torch.long))
    assert got.shape == (config.num_hidden_layers, config.num_attention_heads)
    e = math.exp(2.0)
    full = sum(e / (e + n + 1) for n in range(t)) / t
    sliding = sum(e / (e + min(n + 1, window)) for n in range(t)) / t
    for i, kind in enumerate(config.layer_types):
        expected = sliding if kind == "sliding_attention" else full
        torch.testing.assert_close(got[i], torch.full((config.num_attention_heads,), expected), rtol=1e-5, atol=1e-6)
    assert model.config._attn_implementation == "eager"  # restored (a fresh model's kernel)


def test_sink_mass_bounds_on_random_model() -> None:
    # a moderate sink takes a share strictly inside (0, 1); a very negative one takes none (fp32 rounding aside)
    model = build_model(build_config("nano", VOCAB, 0, 1), seed=1)
    set_sinks(model, 1.5)
    ids = torch.randint(2, VOCAB, (2, 20), generator=torch.Generator().manual_seed(1))
    got = sink_mass_by_layer(model, ids, torch.ones(2, 20, dtype=torch.long))
    assert bool((got > 0).all()) and bool((got < 1).all())
    set_sinks(model, -30.0)
    assert float(sink_mass_by_layer(model, ids, torch.ones(2, 20, dtype=torch.long)).max()) < 1e-6


def test_sink_init_config() -> None:
    assert load_config(None, []).model.sink_init is None  # default unchanged: transformers' init
    assert load_config(None, ["model.sink_init=4"]).model.sink_init == 4.0
    with pytest.raises(Exception, match="sink_init"):
        load_config(None, ["model.sink_init=99"])


def test_sink_init_refused_with_a_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(Exception, match=r"model\.sink_init sets a fresh model's sinks"):
        load_config(None, ["model.sink_init=4", f"model.init_from={tmp_path}"])
