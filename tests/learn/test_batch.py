import warnings

import pytest
import torch

from harmonyrl.learn.batch import MIN_SHARED_PREFIX, _forward, score, shared_prefix_len
from harmonyrl.models.tiny_gpt_oss import build_config, build_model

VOCAB = 97
PREFIX = 40  # longer than nano's sliding window (32): the broadcast cache must respect the window


def _model() -> torch.nn.Module:
    return build_model(build_config("nano", VOCAB, 0, 1), seed=0)


def _rows(prefix: int = PREFIX, lengths: tuple[int, ...] = (55, 61, 48, 70)) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded rows that share their first ``prefix`` tokens, then diverge (different lengths)."""
    g = torch.Generator().manual_seed(3)
    head = torch.randint(1, VOCAB, (prefix,), generator=g)
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.cat([head, torch.randint(1, VOCAB, (n - prefix,), generator=g)])
        attn[i, :n] = 1
    return ids, attn


def _plain(model: torch.nn.Module, ids: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids, attention_mask=attn, use_cache=False).logits


def test_shared_prefix_len_hand_cases() -> None:
    ids = torch.tensor([[5, 6, 7, 8], [5, 6, 9, 8], [5, 6, 7, 0]])
    assert shared_prefix_len(ids, torch.ones_like(ids)) == 2  # column 3 is equal again, but after a break
    attn = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 1]])
    assert shared_prefix_len(ids, attn) == 1  # padding is never "shared"
    assert shared_prefix_len(ids[:1], torch.ones_like(ids[:1])) == 4


def test_shared_prefix_logits_equal_one_plain_pass() -> None:
    model = _model()
    ids, attn = _rows()
    assert shared_prefix_len(ids, attn) >= PREFIX >= MIN_SHARED_PREFIX
    with torch.no_grad():
        shared, plain = _forward(model, ids, attn)[0], _plain(model, ids, attn)
    real = attn.bool()
    assert torch.allclose(shared[real], plain[real], atol=1e-5)


def test_shared_prefix_runs_once_through_the_installed_cache_api() -> None:
    """The head really is run once at batch 1 and its cache reused (the equality tests above would also pass if
    a renamed cache field sent every call down the plain path), with no deprecation warning from transformers."""
    model = _model()
    ids, attn = _rows()
    p = shared_prefix_len(ids, attn)
    calls: list[tuple[int, ...]] = []
    model.register_forward_pre_hook(lambda _m, _a, kw: calls.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        _forward(model, ids, attn)
    assert calls == [(1, p), (ids.shape[0], ids.shape[1] - p)]


def test_shared_prefix_gradients_equal_one_plain_pass() -> None:
    # the prefix runs once with batch 1; autograd must sum every row's gradient through the broadcast
    ids, attn = _rows()
    grads = []
    for fn in (lambda m, i, a: _forward(m, i, a)[0], _plain):
        model = _model()
        logp = torch.log_softmax(fn(model, ids, attn), -1)
        (logp.gather(-1, ids[:, :, None]).squeeze(-1) * attn).sum().backward()
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    assert len(grads[0]) == len(grads[1]) > 0
    for a, b in zip(*grads, strict=True):
        assert torch.allclose(a, b, atol=1e-5 * max(1.0, b.abs().max().item()))


@pytest.mark.parametrize("prefix", [0, MIN_SHARED_PREFIX - 1, MIN_SHARED_PREFIX])
def test_score_is_the_same_with_or_without_a_shared_prefix(prefix: int) -> None:
    model = _model()
    ids, attn = _rows(prefix=prefix, lengths=(30, 41, 25))
    with torch.no_grad():
        lp = score(model, ids, attn).logprobs
        ref = torch.log_softmax(_plain(model, ids, attn)[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    real = attn[:, 1:].bool()
    assert torch.allclose(lp[real], ref[real], atol=1e-5)


def test_identical_rows_still_score() -> None:
    # all rows equal: the shared prefix is capped so the second pass has a token to run
    model = _model()
    ids = torch.randint(1, VOCAB, (1, 30)).expand(3, -1).clone()
    with torch.no_grad():
        lp = score(model, ids, torch.ones_like(ids)).logprobs
    assert lp.shape == (3, 29) and torch.isfinite(lp).all() and torch.equal(lp[0], lp[2])
