"""Counter-based Gumbel sampling: exact distribution, noise independent of the batch."""

from __future__ import annotations

import pytest
import torch

from harmonyrl.engine.local import native
from harmonyrl.engine.local.sampling import RowParams, gumbel_noise, gumbel_uniform, sample, seed_key


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


def _mix32_py(x: int) -> int:
    """The hash in plain Python ints: a third implementation, independent of torch and of C."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x1B873593) & 0xFFFFFFFF
    return x ^ (x >> 16)


@pytest.mark.parametrize("isa", ["native", "generic"])
def test_uniforms_in_c_torch_and_python_agree_bit_for_bit(isa: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The C uniforms (what the engine samples with; its AVX2 build where the CPU has it, and the portable one)
    equal the torch reference and a plain-Python derivation, including keys and counters at the edges of 32 bits
    and vocab sizes that are not multiples of a vector."""
    if isa == "generic":
        monkeypatch.setenv("HARMONYRL_NATIVE_ISA", "generic")
    assert native.library() is not None, "the C extension was not built: pip install -e . needs a C compiler"
    keys = torch.tensor([0, 1, 2**32 - 1, seed_key(42), -1, 2**40 + 7], dtype=torch.int64)
    counters = torch.tensor([0, 2**32 - 1, 3, 17, 5, 2**33], dtype=torch.int64)
    for vocab in (1, 7, 50, 1536, 1543):
        fast = native.gumbel_uniform(keys, counters, vocab)
        assert fast is not None and torch.equal(fast, gumbel_uniform(keys, counters, vocab)), vocab
    for r, (key, counter) in enumerate(zip(keys.tolist(), counters.tolist(), strict=True)):
        row = _mix32_py(_mix32_py(key & 0xFFFFFFFF) ^ (counter & 0xFFFFFFFF))
        for v in range(7):
            bits = _mix32_py((row + v * 0x9E3779B9) & 0xFFFFFFFF)
            assert native.gumbel_uniform(keys, counters, 7)[r, v].item() == ((bits >> 9) + 0.5) / 2**23


def test_noise_is_the_same_without_the_c_extension(monkeypatch: pytest.MonkeyPatch) -> None:
    keys, counters = torch.tensor([seed_key(3), seed_key(4)]), torch.tensor([0, 9])
    with_c = gumbel_noise(keys, counters, 300)
    monkeypatch.setattr(native, "library", lambda: None)
    assert native.gumbel_uniform(keys, counters, 300) is None
    assert torch.equal(gumbel_noise(keys, counters, 300), with_c)
