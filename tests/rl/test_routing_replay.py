"""Routing replay acceptance: with a bf16 engine and an fp32 trainer, R3 makes the trainer route exactly as
the sampler did (agreement 1) and shrinks the mismatch KL; R2 and R3 keep the on-policy ratio at exactly 1.

The routers are made near-tied on purpose. Measured with the unperturbed ``nano`` model and these prompts,
the bf16 engine and the fp32 trainer picked the same experts at every token-layer (agreement 1.0, k3 KL
5e-7): HF initialises routers at std 0.02, whose gaps bf16 noise does not bridge. Trained routers do have
near-ties; setting every expert's router row to one shared row plus 1e-3 noise makes the choice hinge on
differences bf16 rounding can flip (measured: ~2 % of token-layers disagree without replay).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses

import pytest
import torch
from transformers import GptOssForCausalLM

from harmonyrl.algorithms.kl import kl_k3
from harmonyrl.algorithms.losses import masked_token_mean
from harmonyrl.config import RLConfig
from harmonyrl.engine.local.engine import LocalEngine
from harmonyrl.learn.batch import Batch, collate
from harmonyrl.models.moe_routing import NOT_ROUTED
from harmonyrl.models.tiny_gpt_oss import build_config, build_model
from harmonyrl.rl.routing_replay import routing_metrics
from harmonyrl.rl.targets import no_grad_pass, prepare
from harmonyrl.rl.update import rl_update
from harmonyrl.types import Routing, SamplingParams, Trajectory

VOCAB = 300


def near_tied_model() -> GptOssForCausalLM:
    model = build_model(build_config("nano", VOCAB, pad_token_id=0, eos_token_id=1), seed=0).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            w = layer.mlp.router.weight
            w.copy_(w[:1] + 1e-3 * torch.randn(w.shape, generator=torch.Generator().manual_seed(5)))
    return model


def sampled_trajectories(model: GptOssForCausalLM) -> list[Trajectory]:
    """One turn per prompt from a bf16 engine; rewards alternate so every group has variance."""
    engine = LocalEngine(model, max_batch=8, max_seq_len=128, dtype=torch.bfloat16)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(2, VOCAB, (n,), generator=gen).tolist() for n in (5, 9, 14, 20, 7, 11, 3, 16)]

    async def go() -> list[Trajectory]:
        out = []
        for i, p in enumerate(prompts):
            g = await engine.generate(p, SamplingParams(max_new_tokens=24, seed=i))
            assert g.routing is not None
            last = torch.full((1, *g.routing.ids.shape[1:]), NOT_ROUTED, dtype=g.routing.ids.dtype)
            n = len(g.token_ids)
            out.append(
                Trajectory(
                    f"t{i // 2}",
                    i // 2,
                    tuple(p) + g.token_ids,
                    (0,) * len(p) + (1,) * n,
                    (0.0,) * len(p) + g.logprobs,
                    float(i % 2),
                    True,
                    False,
                    None,
                    (),
                    routing=Routing(torch.cat([g.routing.ids, last])),
                )
            )
        return out

    return asyncio.run(go())


@pytest.fixture(scope="module")
def setup() -> tuple[GptOssForCausalLM, Batch]:
    model = near_tied_model()
    return model, collate(sampled_trajectories(model), pad_id=0)


def test_r3_agreement_is_one_and_mismatch_kl_shrinks(setup: tuple[GptOssForCausalLM, Batch]) -> None:
    model, batch = setup
    k = int(model.config.num_experts_per_tok)
    result = {}
    for replay in (False, True):
        logp, _, routed = no_grad_pass(model, batch, replay=replay)
        kl = float(masked_token_mean(kl_k3(logp, batch.sampler_logprobs), batch.loss_mask))
        result[replay] = (routing_metrics(batch, routed, k)["routing/agreement"], kl)
    (agree_none, kl_none), (agree_r3, kl_r3) = result[False], result[True]
    assert agree_none < 1.0
    assert agree_r3 == 1.0
    assert kl_r3 <= kl_none


@pytest.mark.parametrize("mode", ["none", "r2", "r3"])
def test_rl_update_with_replay(setup: tuple[GptOssForCausalLM, Batch], mode: str) -> None:
    base, _ = setup
    trajs = sampled_trajectories(base)
    model = copy.deepcopy(base)
    router_before = model.model.layers[0].mlp.router.weight.detach().clone()
    cfg = RLConfig(routing_replay=mode, epochs=2, minibatches=2, lr=1e-3)  # type: ignore[arg-type]
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    prepared = prepare(trajs, cfg, pad_id=0)
    assert prepared is not None
    metrics = rl_update(model, opt, prepared, cfg, ref_model=None).metrics
    assert metrics["train/ratio_max_dev_first_mb"] == 0.0  # replayed passes reproduce the first pass exactly
    assert {"routing/aux_loss", "routing/load_cv", "routing/load_max_over_mean"} <= metrics.keys()
    if mode == "r3":
        assert metrics["routing/agreement"] == 1.0
    else:
        assert metrics["routing/agreement"] < 1.0
    assert metrics["routing/agreement_own"] < 1.0
    # the router still learns under replay: combine weights come from its live logits
    assert not torch.equal(model.model.layers[0].mlp.router.weight, router_before)


def test_r3_without_engine_routing_is_a_clear_error(setup: tuple[GptOssForCausalLM, Batch]) -> None:
    model, _ = setup
    trajs = [dataclasses.replace(t, routing=None) for t in sampled_trajectories(model)]
    prepared = prepare(trajs, RLConfig(), pad_id=0)
    assert prepared is not None and prepared.batch.routing is None
    opt = torch.optim.AdamW(model.parameters())
    with pytest.raises(ValueError, match="routing_replay=r3 needs the engine's routing"):
        rl_update(copy.deepcopy(model), opt, prepared, RLConfig(routing_replay="r3"), ref_model=None)


def test_collate_pads_routing_and_fills_missing_rows() -> None:
    def traj(n: int, routing: Routing | None) -> Trajectory:
        return Trajectory("t", 0, (5,) * n, (0,) * n, (0.0,) * n, 0.0, True, False, None, (), routing=routing)

    r = Routing(torch.tensor([[[0, 1]], [[2, 3]], [[-1, -1]]], dtype=torch.int8))  # 3 tokens, 1 layer, k=2
    batch = collate([traj(3, r), traj(4, None), traj(2, None)], pad_id=0)
    assert batch.routing is not None and batch.routing.shape == (3, 4, 1, 2)
    assert batch.routing[0, :3].tolist() == r.ids.tolist() and (batch.routing[0, 3] == -1).all()
    assert (batch.routing[1:] == -1).all()  # no routing → the trainer routes those rows itself
    assert collate([traj(2, None)], pad_id=0).routing is None
    with pytest.raises(ValueError, match="routing for 3 of its 5 tokens"):
        collate([traj(5, r)], pad_id=0)
