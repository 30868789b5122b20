"""Memory for a LoRA run (docs/memory.md): the frozen base in bf16 under ``model.precision=bf16``, the adapters,
value head and optimizer state in fp32; the reference policy is the policy's own base with its adapters switched
(never a second model), and it computes what the merged fp32 copy it replaced computed, fresh and resumed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import pytest
import torch
from transformers import GptOssForCausalLM

from harmonyrl.config import RLConfig, load_config
from harmonyrl.errors import CheckpointError
from harmonyrl.harmony.tokenizer import HarmonyTokenizer
from harmonyrl.jobs.compare import named_algorithm
from harmonyrl.learn.batch import collate
from harmonyrl.learn.device import autocast
from harmonyrl.models.lora import (
    ADAPTER_FILE,
    adapter_state_dict,
    add_lora,
    cast_base,
    merged_model,
    merged_state_dict,
    run_as,
)
from harmonyrl.models.tiny_gpt_oss import build_config, build_model, load_model, save_model
from harmonyrl.rl.learner import Learner
from harmonyrl.rl.reference import Reference, rl_start_adapters
from harmonyrl.rl.targets import no_grad_pass
from harmonyrl.run.setup import make_model, resume_model
from harmonyrl.types import Trajectory
from tiny_run import tiny_run

VOCAB = 97
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "experts")
HEAD = tuple(range(1, 41))  # a shared prompt: the shared-prefix pass applies, as in a run


def _episodes() -> list[Trajectory]:
    out = []
    for g in range(2):
        for i in range(4):
            gen = torch.Generator().manual_seed(10 * g + i)
            ids = HEAD + tuple(torch.randint(1, VOCAB, (6 + 2 * i,), generator=gen).tolist())
            mask = (0,) * len(HEAD) + (1,) * (6 + 2 * i)
            out.append(Trajectory(f"t{g}", g, ids, mask, (-4.5,) * len(ids), float(i % 2), True, False, None, ()))
    return out


def _lora(trained_start: bool = False, base: torch.dtype = torch.float32) -> GptOssForCausalLM:
    """A nano model with adapters on attention and experts; ``trained_start``: B moved off zero (a LoRA SFT warm
    start's adapters), else fresh (B = 0)."""
    model = build_model(build_config("nano", VOCAB, 0, 1), seed=0)
    add_lora(model, r=4, alpha=8.0, dropout=0.0, targets=TARGETS)
    cast_base(model, base)
    if trained_start:
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.copy_(0.05 * torch.randn(p.shape, generator=gen))
    return model


def _logp(module: torch.nn.Module, precision: str = "fp32") -> torch.Tensor:
    batch = collate(_episodes(), 0)
    with autocast(precision, torch.device("cpu")):  # type: ignore[arg-type]
        return no_grad_pass(module.eval(), batch)[0]


def _ref_logp(ref: Reference, precision: str = "fp32") -> torch.Tensor:
    with ref.scoring() as module:
        return _logp(module, precision)


def _storages(tensors: Iterable[torch.Tensor]) -> dict[int, int]:
    return {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}


def _dtypes(model: torch.nn.Module) -> tuple[set[torch.dtype], set[torch.dtype]]:
    """(the base's parameter dtypes, the adapters')."""
    base = {p.dtype for n, p in model.named_parameters() if "lora_" not in n}
    return base, {p.dtype for n, p in model.named_parameters() if "lora_" in n}


# ---- dtypes -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lora", "precision", "base"),
    [(True, "bf16", torch.bfloat16), (True, "fp32", torch.float32), (False, "bf16", torch.float32),
     (False, "fp32", torch.float32)],
)  # fmt: skip
def test_the_base_is_bf16_only_for_lora_in_bf16_and_what_trains_is_fp32(
    tmp_path: Path, lora: bool, precision: str, base: torch.dtype
) -> None:
    tok = HarmonyTokenizer.load_default()
    over = ["model.preset=nano", f"model.precision={precision}", *(["model.lora.r=4"] if lora else [])]
    config = load_config(None, over)
    model = make_model(config, tok)
    assert _dtypes(model) == ({base}, {torch.float32} if lora else set())
    assert all(b.dtype == torch.float32 for b in model.buffers())  # RoPE's inv_freq is not rounded
    save_model(model, tmp_path / "ckpt")
    again = resume_model(config, tok, tmp_path / "ckpt")  # a resume rebuilds the same dtypes
    assert _dtypes(again) == _dtypes(model)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values(), strict=True))
    # model.init_from is loaded straight in the base's dtype; the value head and AdamW's state stay fp32
    from_ckpt = make_model(load_config(None, [*over, f"model.init_from={tmp_path / 'ckpt'}"]), tok)
    assert _dtypes(from_ckpt) == _dtypes(model)
    learner = Learner.create(RLConfig(lr=1e-2, advantage={"kind": "gae"}), model, pad_id=0, norm=64.0, seed=0,
                             precision=precision)  # type: ignore[arg-type]  # fmt: skip
    assert learner.update(_episodes()).applied
    assert learner.rule.value_head is not None and all(
        p.dtype == torch.float32 for p in learner.rule.value_head.parameters()
    )
    states = list(learner.optimizer.state.values())
    assert states and all(s["exp_avg"].dtype == s["exp_avg_sq"].dtype == torch.float32 for s in states)
    assert all(p.dtype == torch.float32 for g in learner.optimizer.param_groups for p in g["params"])


def test_a_bf16_base_checkpoint_holds_the_merged_weights_in_bf16_and_eval_loads_it(tmp_path: Path) -> None:
    model = _lora(trained_start=True, base=torch.bfloat16)
    merged = merged_state_dict(model)
    assert {v.dtype for k, v in merged.items() if v.is_floating_point()} == {torch.bfloat16}
    key = "model.layers.0.self_attn.q_proj.weight"
    q = model.model.layers[0].self_attn.q_proj
    want = (q.base_layer.weight.float() + q.get_delta_weight("default").float()).to(torch.bfloat16)  # rounded once
    assert torch.equal(merged[key], want)
    save_model(model, tmp_path)
    loaded = load_model(tmp_path)  # what `harmonyrl eval --checkpoint` reads: fp32, bf16 upcast exactly
    assert {p.dtype for p in loaded.parameters()} == {torch.float32}
    assert torch.equal(loaded.state_dict()[key], merged[key].float())
    # the plain checkpoint scores what the trainer (bf16 base + fp32 adapters under autocast) does, to bf16 rounding
    assert (_logp(loaded, "bf16") - _logp(model, "bf16")).abs().max() < 0.05


def test_merging_an_fp32_base_is_unchanged() -> None:
    # before bf16 bases the merge was ``W + delta``; the fp32 path must keep those bits (the default CPU run's
    # engine and checkpoints)
    model = _lora(trained_start=True)
    old = {}
    for key, value in model.state_dict().items():
        if "lora_" not in key:
            old[key.replace(".base_layer", "")] = value
    deltas = {"model.layers.1.mlp.experts.down_proj": model.model.layers[1].mlp.experts.get_delta_weight("default")}
    merged = merged_state_dict(model)
    for key, delta in deltas.items():
        assert torch.equal(merged[key], old[key] + delta)


# ---- the reference is the policy's own base -----------------------------------------------------------------------


@pytest.mark.parametrize("trained_start", [False, True])
def test_no_second_model_holds_the_lora_reference(trained_start: bool) -> None:
    model = _lora(trained_start)
    own = _storages([*model.parameters(), *model.buffers()])
    adapters = sum(p.numel() * 4 for n, p in model.named_parameters() if "lora_" in n)
    learner = Learner.create(RLConfig(kl={"coef": 0.1}), model, pad_id=0, norm=64.0, seed=0)
    assert learner.reference.module is learner.model
    reachable = _storages(
        [*learner.model.parameters(), *learner.model.buffers(), *learner.reference.module.parameters()]
    )
    # fresh adapters: nothing at all; trained ones (a LoRA SFT start): one frozen adapter-sized copy, no base
    assert sum(reachable.values()) - sum(own.values()) == (adapters if trained_start else 0)
    trainable = {id(p) for g in learner.optimizer.param_groups for p in g["params"]}
    assert trainable == {id(p) for n, p in model.named_parameters() if "lora_" in n and ".default." in n}
    # full fine-tuning keeps its frozen copy (as before)
    full = Learner.create(RLConfig(), build_model(build_config("nano", VOCAB, 0, 1), seed=0), 0, 64.0, 0)
    assert full.reference.module is not full.model and not full.reference.adapters_of_policy


@pytest.mark.parametrize("trained_start", [False, True])
def test_the_reference_computes_the_merged_copy_it_replaced_and_stays_put(trained_start: bool) -> None:
    model = _lora(trained_start)
    old_reference = merged_model(model).eval()  # what Learner.create built before: a merged fp32 copy
    want = _logp(old_reference)
    learner = Learner.create(RLConfig(lr=1e-2, kl={"coef": 0.1}), model, pad_id=0, norm=64.0, seed=0)
    got = _ref_logp(learner.reference)
    if trained_start:  # Wx + B(Ax) against (W + BA)x
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    else:  # adapters off: Wx, exactly
        assert torch.equal(got, want)
    for _ in range(2):
        assert learner.update(_episodes()).applied
    assert torch.equal(_ref_logp(learner.reference), got)  # the reference does not move with the policy...
    assert (_logp(learner.model) - got).abs().max() > 1e-3  # ...which did move


def test_the_reference_of_a_resumed_run_is_the_fresh_runs(tmp_path: Path) -> None:
    # a LoRA SFT warm start: RL starts from trained adapters, saved in checkpoints/sft (lora.safetensors)
    start = _lora(trained_start=True)
    sft = tmp_path / "checkpoints" / "sft"
    save_model(start, sft)
    fresh = Learner.create(RLConfig(kl={"coef": 0.1}), start, pad_id=0, norm=64.0, seed=0)
    fresh_ref = _ref_logp(fresh.reference)
    # the resumed process holds the RL-trained adapters; the start's come from the SFT checkpoint
    resumed_model = _lora(trained_start=False)
    with torch.no_grad():
        for name, p in resumed_model.named_parameters():
            if "lora_B" in name:
                p.fill_(0.01)
    rl_start = rl_start_adapters(tmp_path, resumed_model)
    resumed = Learner.create(RLConfig(kl={"coef": 0.1}), resumed_model, 0, 64.0, 0, rl_start=rl_start)
    assert torch.equal(_ref_logp(resumed.reference), fresh_ref)  # bit for bit: the same fp32 adapter values
    before = _logp(load_model(sft))  # what a resume used before (rl_start_model): the SFT checkpoint's merged weights
    torch.testing.assert_close(fresh_ref, before, atol=1e-5, rtol=0)
    assert not torch.equal(_logp(resumed_model), fresh_ref)  # the policy itself kept its own adapters


def test_without_a_warm_start_the_resumed_reference_is_the_base(tmp_path: Path) -> None:
    model = _lora(trained_start=True)  # stands for adapters trained by RL, resumed
    base = _logp(build_model(build_config("nano", VOCAB, 0, 1), seed=0))
    rl_start = rl_start_adapters(tmp_path, model)  # no checkpoints/sft: RL started from fresh adapters
    learner = Learner.create(RLConfig(kl={"coef": 0.1}), model, 0, 64.0, 0, rl_start=rl_start)
    assert learner.reference.adapter is None and torch.equal(_ref_logp(learner.reference), base)
    sft = tmp_path / "checkpoints" / "sft"
    sft.mkdir(parents=True)
    (sft / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match=ADAPTER_FILE):
        rl_start_adapters(tmp_path, model)


def test_switching_to_the_reference_restores_the_policy_and_its_flags() -> None:
    model = _lora(trained_start=True)
    Learner.create(RLConfig(), model, pad_id=0, norm=64.0, seed=0)  # adds the frozen reference adapter
    flags = {n: p.requires_grad for n, p in model.named_parameters()}  # (peft's forward reorders the experts')
    policy = _logp(model)
    with pytest.raises(RuntimeError, match="inside"), run_as(model, None):
        raise RuntimeError("inside")
    assert {n: p.requires_grad for n, p in model.named_parameters()} == flags
    assert torch.equal(_logp(model), policy)
    assert {n for n, f in flags.items() if f} == set(adapter_state_dict(model))


# ---- invariant 4 with a bf16 base ------------------------------------------------------------------------------


@pytest.mark.parametrize("kl_use", ["loss", "reward"])  # reward: a no-grad old-policy pass, then the gradient pass
@pytest.mark.parametrize("trained_start", [False, True])
def test_a_bf16_base_keeps_the_on_policy_ratio_exactly_one(kl_use: str, trained_start: bool) -> None:
    model = _lora(trained_start, base=torch.bfloat16)
    cfg = RLConfig(lr=1e-2, kl={"coef": 0.1, "use": kl_use})
    learner = Learner.create(cfg, model, pad_id=0, norm=64.0, seed=0, precision="bf16")
    for _ in range(2):  # the second step: the policy has moved off the reference
        metrics = learner.update(_episodes()).metrics
        assert metrics["train/ratio_max_dev_first_mb"] == 0.0
        assert metrics["train/kl_ref_k3"] >= 0.0
    assert metrics["train/kl_ref_k3"] > 0.0
    assert _dtypes(model) == ({torch.bfloat16}, {torch.float32})


def test_soft_q_scores_a_lora_reference() -> None:
    cfg = RLConfig.model_validate(
        {
            **named_algorithm("sac").model_dump(exclude_none=True),
            "lr": 1e-2,
            "loss": {"kind": "soft_q", "replay_batch": 8},
        }
    )
    model = _lora(trained_start=True, base=torch.bfloat16)
    learner = Learner.create(cfg, model, pad_id=0, norm=64.0, seed=0, precision="bf16")
    assert learner.update(_episodes()).applied
    assert {n for n, p in model.named_parameters() if p.requires_grad} == set(adapter_state_dict(model))


# ---- end to end: a killed and resumed LoRA bf16 run with a KL penalty --------------------------------------------

VOLATILE = ("time/", "rollout/tokens_per_s", "engine/")  # wall-clock and batching: depend on the machine


def _stable_rows(run: Path) -> list[dict[str, object]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


def _rl_rows(run: Path) -> int:
    path = run / "metrics.jsonl"
    return path.read_text().count('"phase": "rl"') if path.is_file() else 0


LORA_KL = tiny_run(
    "model.lora.r=4",
    "model.lora.targets=[q_proj,v_proj,experts]",
    "model.precision=bf16",
    "rl.kl.coef=0.05",
    "rl.lr=1e-2",
    "rl.skip_zero_variance_groups=false",  # every group kept and an entropy bonus: each step moves the adapters
    "rl.entropy_coef=0.01",
    "sft.steps=4",
    "sft.checkpoint_every=2",
    "rl.steps=4",
    "threads=1",
)


def test_a_killed_lora_bf16_run_resumes_with_the_same_reference(tmp_path: Path) -> None:
    # the fresh process's reference (a frozen copy of the SFT adapters) and the resumed one's (read back from
    # checkpoints/sft/lora.safetensors) must give the same train/kl_ref_k3, and the run the same bits
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    cli = [sys.executable, "-m", "harmonyrl.cli", "train", *LORA_KL, f"output_dir={tmp_path}"]
    subprocess.run([*cli, "run_name=whole"], check=True, env=env, capture_output=True)
    run = tmp_path / "cut"
    proc = subprocess.Popen([*cli, "run_name=cut"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while _rl_rows(run) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (run / "summary.json").exists(), "the run finished before it could be killed"
    resumed = subprocess.run([sys.executable, "-m", "harmonyrl.cli", "train", "--resume", str(run)], env=env,
                             capture_output=True, text=True)  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resuming after rl step" in resumed.stdout
    rows, whole = _stable_rows(run), _stable_rows(tmp_path / "whole")
    assert rows == whole
    kl = [r["train/kl_ref_k3"] for r in whole if "train/kl_ref_k3" in r]
    assert len(kl) == 4 and kl[-1] > 0.0  # the reference term ran, and the policy moved off it
