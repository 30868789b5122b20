"""LoRA (model.lora): only adapters train, the engine samples the merged model, checkpoints are plain GptOss."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, GptOssForCausalLM

from harmonyrl.config import RLConfig, load_config
from harmonyrl.engine.local import LocalEngine
from harmonyrl.harmony.tokenizer import HarmonyTokenizer
from harmonyrl.learn.batch import collate, score
from harmonyrl.models.attention import set_kernel
from harmonyrl.models.lora import (
    ADAPTER_FILE,
    adapter_state_dict,
    add_lora,
    has_lora,
    merged_model,
    merged_state_dict,
)
from harmonyrl.models.tiny_gpt_oss import build_config, build_model, save_model
from harmonyrl.rl.learner import Learner
from harmonyrl.run.setup import make_model, resume_model
from harmonyrl.types import SamplingParams, Trajectory

VOCAB = 97
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "experts")


def _lora_model(targets: tuple[str, ...] = TARGETS) -> GptOssForCausalLM:
    model = build_model(build_config("nano", VOCAB, 0, 1), seed=0)
    add_lora(model, r=4, alpha=8.0, dropout=0.0, targets=targets)
    return model


def _episodes() -> list[Trajectory]:
    out = []
    for g in range(2):
        for i in range(4):
            gen = torch.Generator().manual_seed(10 * g + i)
            ids = tuple(range(1, 21)) + tuple(torch.randint(1, VOCAB, (6 + i,), generator=gen).tolist())
            mask = (0,) * 20 + (1,) * (6 + i)
            out.append(Trajectory(f"t{g}", g, ids, mask, (-4.5,) * len(ids), float(i % 2), True, False, None, ()))
    return out


def _trained(steps: int = 2) -> GptOssForCausalLM:
    model = _lora_model()
    learner = Learner.create(RLConfig(lr=1e-2), model, pad_id=0, norm=64.0, seed=0)
    for _ in range(steps):
        assert learner.update(_episodes()).applied
    return model


def test_a_step_changes_every_adapter_and_no_base_weight() -> None:
    model = _lora_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    learner = Learner.create(RLConfig(lr=1e-2), model, pad_id=0, norm=64.0, seed=0)
    trainable = {id(p) for g in learner.optimizer.param_groups for p in g["params"]}
    assert trainable == {id(p) for n, p in model.named_parameters() if "lora_" in n}
    # two steps: after the first only B has moved (A's gradient is zero while B is zero)
    for _ in range(2):
        assert learner.update(_episodes()).applied
    after = model.state_dict()
    base = [k for k in after if "lora_" not in k]
    adapters = [k for k in after if "lora_" in k]
    # attention q/k/v/o: A and B each; experts: gate_up and down, A and B each; per layer
    assert len(adapters) == 2 * (4 * 2 + 2 * 2)
    assert all(torch.equal(after[k], before[k]) for k in base)
    assert all(not torch.equal(after[k], before[k]) for k in adapters), [
        k for k in adapters if torch.equal(after[k], before[k])
    ]


def test_merged_weights_keep_the_base_names_and_leave_the_model_alone() -> None:
    model = _trained()
    plain = build_model(build_config("nano", VOCAB, 0, 1), seed=0)
    state_before = {k: v.clone() for k, v in model.state_dict().items()}
    merged = merged_state_dict(model)
    assert set(merged) == set(plain.state_dict())
    assert all(torch.equal(v, state_before[k]) for k, v in model.state_dict().items())
    base = plain.state_dict()
    for key in ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.experts.down_proj"):
        assert not torch.equal(merged[key], base[key])


def test_engine_logprobs_of_a_sampled_sequence_equal_the_trainers() -> None:
    model = _trained()
    engine = LocalEngine(build_model(build_config("nano", VOCAB, 0, 1), seed=0), max_batch=2, max_seq_len=64)
    engine.load_weights(merged_state_dict(model))  # the loop's weight sync
    prompt = list(range(1, 21))

    async def go() -> tuple[tuple[int, ...], tuple[float, ...]]:
        gen = await engine.generate(prompt, SamplingParams(temperature=1.0, max_new_tokens=16, seed=3))
        await engine.close()
        return gen.token_ids, gen.logprobs

    ids, sampler = asyncio.run(go())
    full = torch.tensor([[*prompt, *ids]])
    with torch.no_grad():
        trainer = score(model.eval(), full, torch.ones_like(full)).logprobs[0, len(prompt) - 1 :]
    assert len(ids) == 16
    torch.testing.assert_close(torch.tensor(sampler), trainer, atol=1e-5, rtol=0)
    # and the adapters matter: the base model scores the same tokens differently
    base = build_model(build_config("nano", VOCAB, 0, 1), seed=0).eval()
    with torch.no_grad():
        base_lp = score(base, full, torch.ones_like(full)).logprobs[0, len(prompt) - 1 :]
    assert (base_lp - trainer).abs().max() > 1e-3


def test_a_checkpoint_is_a_plain_gpt_oss_with_the_merged_weights(tmp_path: Path) -> None:
    model = _trained()
    save_model(model, tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    assert type(loaded) is GptOssForCausalLM and not has_lora(loaded)
    ids = torch.tensor([list(range(1, 30))])
    with torch.no_grad():
        want, got = model.eval()(input_ids=ids).logits, loaded.eval()(input_ids=ids).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert (tmp_path / ADAPTER_FILE).is_file()


def test_a_resume_rebuilds_base_and_adapters_bit_for_bit(tmp_path: Path) -> None:
    tok = HarmonyTokenizer.load_default()
    config = load_config(None, ["model.preset=nano", "model.lora.r=4", "model.lora.targets=[q_proj,v_proj,experts]"])
    model = make_model(config, tok)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_()
    save_model(model, tmp_path)
    again = resume_model(config, tok, tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values(), strict=True))
    other = load_config(None, ["model.preset=nano", "model.lora.r=8"])
    with pytest.raises(Exception, match=r"saved adapters do not match model\.lora"):
        resume_model(other, tok, tmp_path)


def test_merged_model_is_a_plain_copy() -> None:
    model = _trained(1)
    plain = merged_model(model)
    assert not has_lora(plain) and adapter_state_dict(plain) == {}
    batch = collate(_episodes(), 0)
    with torch.no_grad():
        a = score(model.eval(), batch.input_ids, batch.attention_mask).logprobs
        b = score(plain.eval(), batch.input_ids, batch.attention_mask).logprobs
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_without_peft_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "peft", None)
    model = build_model(build_config("nano", VOCAB, 0, 1), seed=0)
    with pytest.raises(ImportError, match=r"pip install 'harmonyrl\[lora\]'"):
        add_lora(model, r=4, alpha=8.0, dropout=0.0, targets=("q_proj",))


def test_the_merged_copy_keeps_the_trainers_attention_kernel() -> None:
    # transformers' constructor refuses our registered kernel names: the copy is built eager, then switched
    model = build_model(build_config("nano", VOCAB, 0, 1), seed=0)
    set_kernel(model, "harmonyrl_sink_sdpa")
    add_lora(model, r=4, alpha=8.0, dropout=0.0, targets=("q_proj", "experts"))
    plain = merged_model(model)
    assert plain.config._attn_implementation == "harmonyrl_sink_sdpa"
    ids = torch.tensor([list(range(1, 40))])
    with torch.no_grad():
        torch.testing.assert_close(plain.eval()(input_ids=ids).logits, model.eval()(input_ids=ids).logits)
