import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harmonyrl.algorithms.advantages import broadcast_to_tokens, group_relative_advantages


def test_grpo_hand_derived() -> None:
    # group 0: mean 1/3, unbiased std sqrt(((2/3)^2 + 2*(1/3)^2) / 2) = sqrt(1/3); group 1: all equal → 0
    adv = group_relative_advantages(torch.tensor([1.0, 0, 0, 1, 1, 1]), torch.tensor([0, 0, 0, 1, 1, 1]))
    s = math.sqrt(1 / 3)
    expected = torch.tensor([(2 / 3) / s, -(1 / 3) / s, -(1 / 3) / s, 0, 0, 0])
    assert torch.allclose(adv, expected, atol=1e-5)


def test_dr_grpo_is_centred_only() -> None:
    adv = group_relative_advantages(
        torch.tensor([3.0, 1.0, 5.0]), torch.tensor([7, 7, 2]), std_normalize=False
    )
    assert torch.allclose(adv, torch.tensor([1.0, -1.0, 0.0]))


def test_group_of_one_gets_zero() -> None:
    adv = group_relative_advantages(torch.tensor([0.7]), torch.tensor([4]))
    assert adv.tolist() == [0.0]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 4), st.sampled_from([0.0, 0.5, 1.0])), min_size=1, max_size=20),
    st.booleans(),
)
def test_vectorised_matches_loop(rows: list[tuple[int, float]], std_norm: bool) -> None:
    groups = torch.tensor([g for g, _ in rows])
    rewards = torch.tensor([r for _, r in rows])
    adv = group_relative_advantages(rewards, groups, std_normalize=std_norm)
    for i, (g, r) in enumerate(rows):
        members = [rr for gg, rr in rows if gg == g]
        mean = sum(members) / len(members)
        expected = r - mean
        if std_norm:
            var = sum((x - mean) ** 2 for x in members) / max(len(members) - 1, 1)
            expected /= math.sqrt(var) + 1e-6
        assert abs(float(adv[i]) - expected) < 1e-4


def test_broadcast_zero_outside_mask() -> None:
    out = broadcast_to_tokens(torch.tensor([2.0, -1.0]), torch.tensor([[0, 1, 1], [1, 0, 0]]))
    assert out.tolist() == [[0.0, 2.0, 2.0], [-1.0, 0.0, 0.0]]
