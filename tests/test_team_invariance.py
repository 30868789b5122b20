"""What does and does not depend on the size of the thread team (why ``adaptive_threads`` is opt-in).

Each check runs the same computation with a team of one and of two threads in one process and compares bits.
torch's own CPU softmax backward, a single sum over more than 32,768 elements and MKL's matrix products for a
few rows depend on the team (measured 2026-11-25; docs/contention.md); the ``harmonyrl_eager`` kernel and the
losses' row-first sums remove the first two, nothing here removes the third.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest
import torch
import torch.nn.functional as F

from harmonyrl.algorithms.losses import aggregate_loss
from harmonyrl.config import load_config
from harmonyrl.models.attention import set_kernel
from harmonyrl.models.team_invariant import softmax_last_dim
from harmonyrl.models.tiny_gpt_oss import build_config, build_model
from harmonyrl.trainer.batch import collate, score
from harmonyrl.trainer.learner import Learner
from harmonyrl.types import Trajectory

T = TypeVar("T")
VOCAB = 300


@pytest.fixture(autouse=True)
def restore_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def with_teams(fn: Callable[[], T]) -> tuple[T, T]:
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
    theirs = with_teams(lambda: softmax_grad(lambda x: F.softmax(x, dim=-1)))
    ours = with_teams(lambda: softmax_grad(softmax_last_dim))
    assert not torch.equal(*theirs)  # the cause; if torch fixes it this test says so
    assert torch.equal(*ours)
    assert torch.allclose(ours[0], theirs[0], atol=1e-7)
    x = torch.randn(40_000, generator=torch.Generator().manual_seed(2))
    a, b = with_teams(lambda: x.sum())
    assert not torch.equal(a, b)
    loss = torch.randn(64, 2048, generator=torch.Generator().manual_seed(3))  # 131k tokens in one reduction
    mask = torch.rand(64, 2048, generator=torch.Generator().manual_seed(4)) > 0.3
    for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        a, b = with_teams(lambda mode=mode: aggregate_loss(loss, mask, mode, norm=2048.0))  # type: ignore[misc]
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


def test_training_gradients_do_not_depend_on_the_team_with_harmonyrl_eager() -> None:
    a, b = with_teams(lambda: model_grads("harmonyrl_eager"))
    assert a == b
    a, b = with_teams(lambda: model_grads("eager"))  # transformers' own eager kernel: not so
    assert a != b


def test_an_rl_update_does_not_depend_on_the_team() -> None:
    def update() -> str:
        model = build_model(build_config("nano", VOCAB, 0, 1), seed=0)
        set_kernel(model, "harmonyrl_eager")
        learner = Learner.create(load_config().rl, model, 0, 512.0, seed=0)
        result = learner.update(trajectories(32, seed=5))
        assert result.applied
        return digest(iter(model.parameters()))

    a, b = with_teams(update)
    assert a == b


def test_mkl_products_of_a_few_rows_depend_on_the_team_so_adapting_is_opt_in() -> None:
    x = torch.randn(1, 7, 64, generator=torch.Generator().manual_seed(6))  # a 7-token prefill
    w = torch.randn(128, 64, generator=torch.Generator().manual_seed(7))
    a, b = with_teams(lambda: F.linear(x, w))
    assert not torch.equal(a, b)  # if MKL ever makes this team-invariant, adaptive threads could be the default
    assert not load_config().adaptive_threads
