"""Scoring in chunks (what a 201k vocabulary needs) equals scoring in one piece, values and gradients."""

from __future__ import annotations

import pytest
import torch

from harmonyrl.learn import batch as batch_mod
from harmonyrl.learn.batch import score
from harmonyrl.learn.token_scores import chunk_positions, chunked_token_scores, token_scores
from harmonyrl.models.tiny_gpt_oss import build_config, build_model

VOCAB = 97


def _model() -> torch.nn.Module:
    return build_model(build_config("nano", VOCAB, 0, 1), seed=0)


def _rows() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Three right-padded rows sharing a 20-token prefix (the shared-prefix path runs too) and a loss mask."""
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(1, VOCAB, (3, 45), generator=g)
    ids[:, :20] = ids[0, :20]
    attn = torch.ones_like(ids)
    attn[1, 38:], attn[2, 30:] = 0, 0
    mask = torch.zeros(3, 44)
    mask[:, 25:29], mask[0, 40:44] = 1.0, 1.0
    return ids, attn, mask


def test_chunk_positions_keeps_a_chunk_within_the_budget() -> None:
    # 16 rows x 201,088 ids = 3,217,408 per position; 2**25 / that = 10.4 -> 10 positions (128.7 M floats)
    assert chunk_positions(16, 201_088) == 10
    assert chunk_positions(1, 201_088) == 166
    assert chunk_positions(64, 10**9) == 1  # never 0: one position always fits


def test_chunked_head_equals_one_piece_values_and_gradients() -> None:
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 50, bias=False)
    states = torch.randn(2, 13, 8, requires_grad=True)
    targets = torch.randint(0, 50, (2, 13))
    results = []
    for chunk in (None, 4):
        head.zero_grad()
        states.grad = None
        if chunk is None:
            lp, ent = token_scores(head(states), targets, entropy_grad=True)
        else:
            lp, ent = chunked_token_scores(head, states, targets, entropy_grad=True, chunk=chunk)
        (lp.sum() + 0.3 * ent.sum()).backward()
        assert head.weight.grad is not None and states.grad is not None
        results.append((lp.detach(), ent.detach(), head.weight.grad.clone(), states.grad.clone()))
    for a, b in zip(*results, strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("with_mask", [False, True])
def test_score_chunked_equals_one_piece(monkeypatch: pytest.MonkeyPatch, with_mask: bool) -> None:
    """score() above the logits budget (forced low here) gives the one-piece log-probs, entropies and gradients
    within fp32 tolerance; with ``needed`` only those positions are scored and the others are 0."""
    ids, attn, mask = _rows()
    needed = mask if with_mask else None
    runs = []
    for budget in (1 << 40, 3 * 7 * VOCAB):  # one piece; then 7 positions a chunk (chunk_positions(3, 97))
        monkeypatch.setattr(batch_mod, "LOGITS_BUDGET", budget)
        model = _model()
        s = score(model, ids, attn, entropy_grad=True, needed=needed)
        ((s.logprobs * mask).sum() + (s.entropy * mask).sum()).backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        runs.append((s.logprobs.detach(), s.entropy.detach(), grads))
    (lp1, ent1, g1), (lp2, ent2, g2) = runs
    sel = mask.bool() if with_mask else attn[:, 1:].bool()
    assert torch.allclose(lp1[sel], lp2[sel], atol=1e-5) and torch.allclose(ent1[sel], ent2[sel], atol=1e-5)
    if with_mask:
        assert (lp2[~sel] == 0).all() and (ent2[~sel] == 0).all()
    assert len(g1) == len(g2) > 0
    for a, b in zip(g1, g2, strict=True):
        assert torch.allclose(a, b, atol=1e-5 * max(1.0, b.abs().max().item()))


def test_default_vocabulary_is_scored_in_one_piece(monkeypatch: pytest.MonkeyPatch) -> None:
    """Below the budget score() is the one-piece computation itself (so the default run is unchanged bit for bit):
    the chunked path must not run at all, and ``needed`` is ignored."""
    ids, attn, mask = _rows()

    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("chunked path taken")

    monkeypatch.setattr(batch_mod, "chunked_token_scores", boom)
    model = _model()
    with torch.no_grad():
        s = score(model, ids, attn, needed=mask)
        logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1]
    ref = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    real = attn[:, 1:].bool()
    assert torch.allclose(s.logprobs[real], ref[real], atol=1e-5)
    assert (s.logprobs[real & ~mask.bool()] != 0).all()  # unneeded positions are scored too
