"""``model.head_init``: the LM head of a fresh model, random (default, unchanged) or a copy of the embedding."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harmonyrl.config import ConfigError, load_config
from harmonyrl.harmony.tokenizer import HarmonyTokenizer
from harmonyrl.models.tiny_gpt_oss import build_config, build_model
from harmonyrl.run.setup import make_model


def _pair(head_init: str) -> tuple[torch.Tensor, torch.Tensor]:
    model = build_model(build_config("nano", 97, 0, 1), seed=3, head_init=head_init)  # type: ignore[arg-type]
    return model.model.embed_tokens.weight, model.lm_head.weight


def test_embedding_head_starts_equal_and_stays_untied() -> None:
    embed, head = _pair("embedding")
    assert torch.equal(head, embed)
    assert head.data_ptr() != embed.data_ptr()  # two parameters: training moves them apart
    with torch.no_grad():
        head[0, 0] += 1.0
    assert not torch.equal(head, embed)


def test_random_head_is_the_previous_init() -> None:
    """The default draws exactly what build_model drew before the option existed (transformers' init under
    ``manual_seed(3)``), and the copy changes nothing but the head."""
    embed, head = _pair("random")
    assert not torch.allclose(head, embed)
    with torch.random.fork_rng():
        torch.manual_seed(3)
        from transformers import GptOssForCausalLM

        plain = GptOssForCausalLM(build_config("nano", 97, 0, 1)).float()
    assert torch.equal(head, plain.lm_head.weight)
    copied = build_model(build_config("nano", 97, 0, 1), seed=3, head_init="embedding")
    others = [(n, p) for n, p in copied.named_parameters() if n != "lm_head.weight"]
    assert all(torch.equal(p, plain.get_parameter(n)) for n, p in others)


def test_config_reaches_the_trainer_model() -> None:
    tok = HarmonyTokenizer.load_default()
    on = make_model(load_config(None, ["model.preset=nano", "model.head_init=embedding"]), tok)
    off = make_model(load_config(None, ["model.preset=nano"]), tok)
    assert torch.equal(on.lm_head.weight, on.model.embed_tokens.weight)
    assert not torch.allclose(off.lm_head.weight, off.model.embed_tokens.weight)


def test_head_init_with_a_checkpoint_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"model\.head_init applies to a fresh model only") as info:
        load_config(None, [f"model.init_from={tmp_path}", "model.head_init=embedding"])
    assert "\n" not in str(info.value).strip()
    with pytest.raises(ConfigError, match=r"model\.head_init"):
        load_config(None, ["model.head_init=tied"])
