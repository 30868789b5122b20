"""What does and does not depend on the size of the thread team (why ``adaptive_threads`` can be the default).

Each check runs the same computation with a team of one and of two threads in one process and compares bits.
torch's own CPU softmax backward, a single sum over more than 32,768 elements and MKL's matrix products for a
few rows depend on the team (measured 2026-11-25; docs/contention.md); the ``harmonyrl_eager`` kernel, the
losses' row-first sums and MKL's strict reproducibility mode (set by ``import harmonyrl``) remove all three.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest
import torch
import torch.nn.functional as F

from harmonyrl.algorithms.losses import aggregate_loss
from harmonyrl.config import load_config
from harmonyrl.learn.batch import collate, score
from harmonyrl.models.attention import CUDA_TRAINING_ONLY, KERNELS, THREAD_INVARIANT_KERNELS, set_kernel
from harmonyrl.models.thread_invariant import softmax_last_dim
from harmonyrl.models.tiny_gpt_oss import build_config, build_model
from harmonyrl.rl.learner import Learner
from harmonyrl.run.setup import adapts_threads
from harmonyrl.sft.train import Demo, sft_step
from harmonyrl.threads import available_cores, products_are_thread_invariant
from harmonyrl.types import Trajectory

T = TypeVar("T")
VOCAB = 300


@pytest.fixture(autouse=True)
def restore_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def with_thread_counts(fn: Callable[[], T]) -> tuple[T, T]:
    """``fn()`` computed by a team of one thread, then of two."""
    out = []
    for n in (1, 2):
        torch.set_num_threads(n)
        out.append(fn())
    return out[0], out[1]


def digest(tensors: Iterator[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def softmax_grad(softmax: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    x = torch.randn(16, 4, 188, 189, generator=torch.Generator().manual_seed(0), requires_grad=True)
    g = torch.randn(16, 4, 188, 189, generator=torch.Generator().manual_seed(1))
    softmax(x).backward(g)
    assert x.grad is not None
    return x.grad


def test_torch_softmax_backward_and_long_sums_depend_on_the_team_ours_do_not() -> None:
    theirs = with_thread_counts(lambda: softmax_grad(lambda x: F.softmax(x, dim=-1)))
    ours = with_thread_counts(lambda: softmax_grad(softmax_last_dim))
    assert not torch.equal(*theirs)  # the cause; if torch fixes it this test says so
    assert torch.equal(*ours)
    assert torch.allclose(ours[0], theirs[0], atol=1e-7)
    x = torch.randn(40_000, generator=torch.Generator().manual_seed(2))
    a, b = with_thread_counts(lambda: x.sum())
    assert not torch.equal(a, b)
    loss = torch.randn(64, 2048, generator=torch.Generator().manual_seed(3))  # 131k tokens in one reduction
    mask = torch.rand(64, 2048, generator=torch.Generator().manual_seed(4)) > 0.3
    for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        a, b = with_thread_counts(lambda mode=mode: aggregate_loss(loss, mask, mode, norm=2048.0))  # type: ignore[misc]
        assert torch.equal(a, b), mode


def trajectories(n: int, seed: int = 0) -> list[Trajectory]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = int(torch.randint(120, 200, (1,), generator=g))
        ids = tuple(int(x) for x in torch.randint(2, VOCAB, (length,), generator=g))
        mask = tuple(int(j >= length // 3) for j in range(length))
        logp = tuple(-float(torch.rand(1, generator=g)) * m for m in mask)
        reward = float(torch.rand(1, generator=g) > 0.5)
        out.append(Trajectory(f"t{i // 4}", i // 4, ids, mask, logp, reward, True, False, None, ()))
    return out


def model_grads(kernel: str) -> str:
    model = build_model(build_config("nano", VOCAB, 0, 1), seed=0)
    set_kernel(model, kernel)  # type: ignore[arg-type]
    batch = collate(trajectories(16), 0)
    scored = score(model, batch.input_ids, batch.attention_mask)
    (-(scored.logprobs * batch.loss_mask).sum()).backward()
    return digest(p.grad for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("kernel", [k for k in KERNELS if k not in CUDA_TRAINING_ONLY])  # the kernels that train here
def test_training_gradients_depend_on_the_team_only_with_transformers_eager(kernel: str) -> None:
    a, b = with_thread_counts(lambda: model_grads(kernel))
    assert (a == b) == (kernel in THREAD_INVARIANT_KERNELS)  # the set that may adapt the team (adapts_threads)
    assert (kernel in THREAD_INVARIANT_KERNELS) == (kernel != "eager")


def test_the_thread_count_adapts_only_with_a_thread_invariant_kernel() -> None:
    assert adapts_threads(load_config())
    assert not adapts_threads(load_config(overrides=["model.attention=eager"]))
    assert not adapts_threads(load_config(overrides=["adaptive_threads=false"]))


def test_an_rl_update_does_not_depend_on_the_team() -> None:
    def update() -> str:
        model = build_model(build_config("nano", VOCAB, 0, 1), seed=0)
        set_kernel(model, "harmonyrl_eager")
        learner = Learner.create(load_config().rl, model, 0, 512.0, seed=0)
        result = learner.update(trajectories(32, seed=5))
        assert result.applied
        return digest(iter(model.parameters()))

    a, b = with_thread_counts(update)
    assert a == b


def micro_sft_steps() -> str:
    """Two real SFT steps of the ``micro`` model on demos that share a 100-token prompt (scored once, as a few-row
    pass: what differed with 1 and 2 threads before MKL's strict mode)."""
    g = torch.Generator().manual_seed(1)
    prompt = tuple(int(x) for x in torch.randint(2, VOCAB, (100,), generator=g))
    demos = []
    for _ in range(16):
        reply = tuple(
            int(x) for x in torch.randint(2, VOCAB, (int(torch.randint(10, 60, (1,), generator=g)),), generator=g)
        )
        demos.append(Demo(prompt + reply, (0,) * len(prompt) + (1,) * len(reply)))
    model = build_model(build_config("micro", VOCAB, 0, 1), seed=0)
    set_kernel(model, load_config().model.attention)  # the default kernel
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(2):
        sft_step(model, optimizer, demos, 0)
    return digest(iter(model.parameters()))


def test_micro_training_steps_do_not_depend_on_the_team_so_adapting_is_the_default() -> None:
    # a micro SFT step differed before MKL's strict mode (its grouped MoE products, docs/contention.md)
    a, b = with_thread_counts(micro_sft_steps)
    assert a == b
    assert os.environ["MKL_CBWR"] == "AUTO,STRICT"
    x = torch.randn(1, 7, 64, generator=torch.Generator().manual_seed(6))  # a 7-token prefill: differed too
    w = torch.randn(128, 64, generator=torch.Generator().manual_seed(7))
    a2, b2 = with_thread_counts(lambda: F.linear(x, w))
    assert torch.equal(a2, b2)
    assert products_are_thread_invariant()
    assert load_config().adaptive_threads and load_config().model.attention == "harmonyrl_eager"


def test_a_product_before_import_harmonyrl_keeps_the_team_fixed_with_a_warning() -> None:
    script = (
        "import os, warnings, torch\n"
        "os.environ.pop('MKL_CBWR', None)\n"
        "torch.ones(4, 4) @ torch.ones(4, 4)\n"  # MKL initialises here, without its strict mode
        "import harmonyrl\n"
        "from harmonyrl import threads\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    threads.configure(0, adaptive=True)\n"
        "print(threads._governor is None, [str(w.message)[:40] for w in caught])\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    if available_cores() > 1:
        assert out.stdout.strip() == 'True ["MKL\'s strict reproducibility mode is not"]'
