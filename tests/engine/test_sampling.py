"""Counter-based Gumbel sampling: exact distribution, noise independent of the batch."""

from __future__ import annotations

import torch

from harmonyrl.engine.sampling import RowParams, gumbel_noise, sample, seed_key


def rows(n: int, counters: torch.Tensor, temperature: float = 1.0, top_k: int = 0) -> RowParams:
    return RowParams(
        temperature=torch.full((n,), temperature),
        top_k=torch.full((n,), top_k, dtype=torch.int64),
        top_p=torch.ones(n),
        keys=torch.full((n,), seed_key(42), dtype=torch.int64),
        counters=counters,
        filtered=top_k > 0,
    )


def test_noise_depends_only_on_seed_counter_and_vocab_index() -> None:
    keys, counters = torch.tensor([seed_key(1), seed_key(2), seed_key(1)]), torch.tensor([5, 5, 6])
    batch = gumbel_noise(keys, counters, 50)
    alone = gumbel_noise(keys[2:], counters[2:], 50)
    assert torch.equal(batch[2], alone[0])
    assert not torch.equal(batch[0], batch[1]) and not torch.equal(batch[0], batch[2])
    assert torch.isfinite(batch).all()


def test_samples_follow_softmax_and_top_k_renormalises() -> None:
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    n = 20000
    tokens, logprobs = sample(logits.expand(n, 4), rows(n, torch.arange(n)))
    freq = torch.bincount(tokens, minlength=4).float() / n
    torch.testing.assert_close(freq, torch.softmax(logits, -1), atol=0.015, rtol=0)
    torch.testing.assert_close(logprobs, torch.log_softmax(logits, -1)[tokens])
    top2, _ = sample(logits.expand(n, 4), rows(n, torch.arange(n), temperature=2.0, top_k=2))
    freq2 = torch.bincount(top2, minlength=4).float() / n
    torch.testing.assert_close(freq2, torch.softmax(torch.tensor([1.0, 0.5, -1e9, -1e9]), -1), atol=0.015, rtol=0)


def test_temperature_one_and_greedy_rows_match_the_plain_formula() -> None:
    """A batch all at T=1 skips the division, one without greedy rows skips the plain argmax: the same tokens
    as argmax(logits / T + noise), with greedy rows taking argmax(logits)."""
    logits = torch.randn(6, 40, generator=torch.Generator().manual_seed(0))
    counters = torch.arange(6)
    noise = gumbel_noise(torch.full((6,), seed_key(42), dtype=torch.int64), counters, 40)
    tokens, _ = sample(logits, rows(6, counters))  # every row at T=1
    assert torch.equal(tokens, (logits + noise).argmax(-1))
    temps = torch.tensor([0.0, 1.0, 0.5, 0.0, 2.0, 1.0])
    mixed = RowParams(**{**vars(rows(6, counters)), "temperature": temps})
    tokens, _ = sample(logits, mixed)
    want = (logits / torch.where(temps > 0, temps, 1.0)[:, None] + noise).argmax(-1)
    want = torch.where(temps > 0, want, logits.argmax(-1))
    assert torch.equal(tokens, want)
