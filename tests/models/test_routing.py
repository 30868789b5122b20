"""The trainer-side MoE override: exact without replay, replay semantics and gradients, and memory.

Memory is measured by recording the size of every tensor any aten op produces inside the MoE blocks
(``TorchDispatchMode``): a routed MoE on ``T`` tokens never makes one larger than ``T·k·2I`` (the
gate/up activations of the routed pairs), while running every expert on every token makes ``T·E·2I``
(the 180 GiB of the public GPT-OSS retrospective, at scale). The model here has 16 experts top-2, so
the two differ by 8x; a test patches in an all-experts implementation to show the probe catches it.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import GptOssConfig, GptOssForCausalLM

from harmonyrl.learn.batch import MIN_SHARED_PREFIX, score
from harmonyrl.models.moe_routing import MoeRouting, routing_dtype

E, K, HID, INTER, VOCAB = 16, 2, 32, 64, 64


def wide_moe_model(seed: int = 0) -> GptOssForCausalLM:
    cfg = GptOssConfig(
        vocab_size=VOCAB, hidden_size=HID, intermediate_size=INTER, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, num_local_experts=E, num_experts_per_tok=K, sliding_window=8,
        layer_types=["sliding_attention", "full_attention"], max_position_embeddings=128,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, pad_token_id=0, eos_token_id=1,
        tie_word_embeddings=False, attn_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(seed)
    model = GptOssForCausalLM(cfg).float().eval()
    with torch.no_grad():  # HF initialises the router to ~0; spread it so top-k choices are not ties
        for layer in model.model.layers:
            layer.mlp.router.weight.normal_(0, 1.0)
    return model


def batch(b: int = 3, t: int = 24, shared: int = MIN_SHARED_PREFIX + 2) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(2, VOCAB, (b, t), generator=gen)
    ids[:, :shared] = ids[0, :shared]  # exercise the shared-prefix path of score()
    mask = torch.ones_like(ids)
    mask[-1, t - 5 :] = 0  # one padded row
    return ids, mask


def test_without_replay_score_is_bit_identical_to_hf() -> None:
    model = wide_moe_model()
    ids, mask = batch()
    with torch.no_grad():
        plain = score(model, ids, mask)
        routing = MoeRouting(model, tuple(ids.shape))
        routed = score(model, ids, mask, routing=routing)
    assert torch.equal(plain.logprobs, routed.logprobs)
    assert "forward" not in vars(model.model.layers[0].mlp)  # the override is scoped
    assert (routing.own >= 0).all() and torch.equal(routing.own, routing.used)
    # the batch-1 prefix call's routing is broadcast to every row
    assert torch.equal(routing.own[1, :MIN_SHARED_PREFIX], routing.own[0, :MIN_SHARED_PREFIX])


def reference_moe(mlp: torch.nn.Module, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Token-by-token GPT-OSS MoE at given experts ``ids`` ``[N, k]``: softmax over their router logits."""
    ex = mlp.experts
    logits = x @ mlp.router.weight.T + mlp.router.bias
    out = []
    for n in range(x.shape[0]):
        w = torch.softmax(logits[n, ids[n]], dim=0)
        acc = torch.zeros(x.shape[1])
        for j, e in enumerate(ids[n].tolist()):
            act = ex._apply_gate(x[n] @ ex.gate_up_proj[e] + ex.gate_up_proj_bias[e])
            acc = acc + w[j] * (act @ ex.down_proj[e] + ex.down_proj_bias[e])
        out.append(acc)
    return torch.stack(out)


def test_replay_uses_given_experts_with_current_router_weights_and_grads() -> None:
    model = wide_moe_model()
    mlp = model.model.layers[0].mlp
    x = torch.randn(1, 6, HID, generator=torch.Generator().manual_seed(3))
    replay = torch.full((1, 6, 2, K), -1, dtype=torch.int8)
    replay[0, :, 0] = torch.tensor([[3, 9], [0, 15], [7, 1], [2, 2 + 1], [14, 5], [11, 6]], dtype=torch.int8)
    replay[0, 4, 0, 1] = -1  # token 4: incomplete record → the router's own top-k
    routing = MoeRouting(model, (1, 6), replay)
    with routing:
        out, scores = mlp(x)
    own = torch.topk(x[0] @ mlp.router.weight.T + mlp.router.bias, K).indices
    expected_ids = replay[0, :, 0].long().clone()
    expected_ids[4] = own[4]
    assert torch.equal(routing.used[0, :, 0], expected_ids)
    assert torch.equal(routing.own[0, :, 0], own)
    logits = x[0] @ mlp.router.weight.T + mlp.router.bias
    torch.testing.assert_close(scores, torch.softmax(logits.gather(1, expected_ids), dim=1))
    ref = reference_moe(mlp, x[0], expected_ids)
    torch.testing.assert_close(out[0], ref, rtol=0, atol=1e-5)
    # gradients reach the router (at the replayed experts) and agree with the reference's
    (g_ours,) = torch.autograd.grad(out.square().sum(), mlp.router.weight)
    (g_ref,) = torch.autograd.grad(reference_moe(mlp, x[0], expected_ids).square().sum(), mlp.router.weight)
    assert g_ours.abs().sum() > 0
    torch.testing.assert_close(g_ours, g_ref, rtol=1e-4, atol=1e-6)


def test_replaying_own_routing_is_bit_identical() -> None:
    """R2's promise: replaying the first pass's routing reproduces it exactly (ratio 1 on policy)."""
    model = wide_moe_model()
    ids, mask = batch()
    with torch.no_grad():
        first = MoeRouting(model, tuple(ids.shape))
        a = score(model, ids, mask, routing=first)
        b = score(model, ids, mask, routing=MoeRouting(model, tuple(ids.shape), first.used))
    assert torch.equal(a.logprobs, b.logprobs)


def test_bad_replay_is_a_clear_error() -> None:
    model = wide_moe_model()
    with pytest.raises(ValueError, match=r"expected \[B, T, L, k\]"):
        MoeRouting(model, (2, 5), torch.zeros(2, 5, 2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="names expert 16; the model has 16"):
        MoeRouting(model, (1, 2), torch.full((1, 2, 2, K), 16))
    with pytest.raises(TypeError, match="not a GPT-OSS causal LM"):
        MoeRouting(torch.nn.Linear(2, 2), (1, 1))
    assert routing_dtype(127) == torch.int8 and routing_dtype(128) == torch.int16


class LargestTensor(TorchDispatchMode):
    """Records the largest numel of any tensor an op returns, except parameter-sized ones (weight gradients,
    possibly transposed, are the size of the weights whatever the routing)."""

    def __init__(self, skip_sizes: set[int]) -> None:
        super().__init__()
        self.skip, self.largest = skip_sizes, 0

    def __torch_dispatch__(
        self, func: Callable[..., object], types: object, args: tuple = (), kwargs: dict | None = None
    ) -> object:
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor) and t.numel() not in self.skip:
                self.largest = max(self.largest, t.numel())
        return out


def moe_probe(model: GptOssForCausalLM) -> tuple[LargestTensor, list[torch.utils.hooks.RemovableHandle]]:
    """A probe active only while an MoE block runs forward."""
    probe = LargestTensor({p.numel() for p in model.parameters()})

    def enter(*_: object) -> None:  # a pre-hook's return value would replace the module's inputs
        probe.__enter__()

    def leave(*_: object) -> None:
        probe.__exit__(None, None, None)

    hooks = []
    for layer in model.model.layers:
        hooks += [layer.mlp.register_forward_pre_hook(enter), layer.mlp.register_forward_hook(leave)]
    return probe, hooks


@pytest.mark.parametrize("impl", ["grouped_mm", "eager"])  # transformers' default, and its reference loop
@pytest.mark.parametrize("train", [False, True])
def test_scoring_moe_never_materialises_all_experts(train: bool, impl: str) -> None:
    model = wide_moe_model().train(train)
    model.config._experts_implementation = impl
    assert model.model.layers[0].mlp.experts.config._experts_implementation == impl
    ids, mask = batch(b=4, t=40, shared=0)
    tokens = ids.numel()
    probe, hooks = moe_probe(model)
    with torch.set_grad_enabled(train):
        scored = score(model, ids, mask, routing=MoeRouting(model, tuple(ids.shape)))
    for h in hooks:
        h.remove()
    routed_bound, all_experts = tokens * K * 2 * INTER, tokens * E * 2 * INTER
    assert 0 < probe.largest <= routed_bound < all_experts
    if train:  # backward of the MoE: again no tensor beyond the routed pairs (weight grads excepted)
        back = LargestTensor({p.numel() for p in model.parameters()})
        logits_size = ids.shape[0] * ids.shape[1] * VOCAB  # the loss's own gradient, not the MoE's
        with back:
            scored.logprobs.sum().backward()
        assert back.largest <= max(routed_bound, logits_size, 4 * 2 * 40 * 40)  # attn probs [B, H, T, T]
        assert model.model.layers[0].mlp.router.weight.grad is not None


def test_probe_catches_an_all_experts_implementation() -> None:
    """The guard above is not vacuous: the transformers-4.55-style eval path (every expert on every token,
    non-selected ones weighted 0) trips it."""
    model = wide_moe_model()
    for layer in model.model.layers:
        ex = layer.mlp.experts

        def dense(x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor, ex: torch.nn.Module = ex) -> torch.Tensor:
            full_w = torch.zeros(x.shape[0], E).scatter(1, idx, w)  # [N, E]
            gate_up = torch.bmm(x.expand(E, -1, -1), ex.gate_up_proj) + ex.gate_up_proj_bias[:, None]
            out = torch.bmm(ex._apply_gate(gate_up), ex.down_proj) + ex.down_proj_bias[:, None]  # [E, N, H]
            return (out * full_w.T[..., None]).sum(0)

        ex.forward = dense
    ids, mask = batch(b=4, t=40, shared=0)
    probe, _ = moe_probe(model)
    with torch.no_grad():
        score(model, ids, mask, routing=MoeRouting(model, tuple(ids.shape)))
    assert probe.largest >= ids.numel() * E * 2 * INTER


def test_probe_catches_batched_mm_and_moe_routing_refuses_it() -> None:
    """transformers' ``batched_mm`` experts gather a weight matrix per routed pair: ``T·k·H·2I`` floats."""
    model = wide_moe_model()
    model.config._experts_implementation = "batched_mm"
    ids, mask = batch(b=4, t=40, shared=0)
    probe, _ = moe_probe(model)
    with torch.no_grad():
        score(model, ids, mask)  # plain HF forward, no override
    assert probe.largest >= ids.numel() * K * HID * 2 * INTER
    with pytest.raises(ValueError, match="batched_mm"):
        MoeRouting(model, tuple(ids.shape))
