"""Replay buffer: FIFO eviction, env failures refused, seeded determinism, resume round-trip."""

from __future__ import annotations

import io

import pytest
import torch

from harmonyrl.rl.replay_buffer import ReplayBuffer
from harmonyrl.types import Failure, Trajectory


def _traj(i: int, failed: bool = False) -> Trajectory:
    return Trajectory(
        task_id=f"t{i}",
        group_id=i,
        token_ids=(1, 2, 3),
        loss_mask=(0, 1, 1),
        sampler_logprobs=(0.0, -0.5, -0.25),
        reward=float(i % 2),
        terminated=True,
        truncated=False,
        failure=Failure("tool_crash", "boom") if failed else None,
        turns=(),
    )


def _ids(trajs: list[Trajectory]) -> list[str]:
    return [t.task_id for t in trajs]


def _filled(seed: int, n: int = 10, capacity: int = 100) -> ReplayBuffer:
    buf = ReplayBuffer(capacity, seed)
    buf.add(_traj(i) for i in range(n))
    return buf


def test_fifo_eviction_keeps_newest() -> None:
    buf = ReplayBuffer(capacity=3, seed=0)
    assert buf.add([_traj(0), _traj(1)]) == 2
    buf.add([_traj(2), _traj(3), _traj(4)])
    assert len(buf) == 3
    assert sorted(_ids(buf.sample(3))) == ["t2", "t3", "t4"]


def test_failures_are_skipped_and_counted() -> None:
    buf = ReplayBuffer(capacity=10, seed=0)
    assert buf.add([_traj(0), _traj(1, failed=True), _traj(2)]) == 2
    assert len(buf) == 2 and buf.num_skipped == 1
    assert "t1" not in _ids(buf.sample(2))


def test_sampling_is_deterministic_and_without_replacement() -> None:
    a, b = _filled(seed=5), _filled(seed=5)
    draws_a = [_ids(a.sample(4)) for _ in range(5)]
    assert draws_a == [_ids(b.sample(4)) for _ in range(5)]
    assert all(len(set(d)) == 4 for d in draws_a)  # no repeats when n ≤ size
    assert sorted(_ids(a.sample(10))) == [f"t{i}" for i in range(10)]
    other = _filled(seed=6)
    assert [_ids(other.sample(4)) for _ in range(5)] != draws_a


def test_oversampling_uses_replacement() -> None:
    buf = _filled(seed=1, n=3)
    drawn = _ids(buf.sample(7))
    assert len(drawn) == 7 and set(drawn) <= {"t0", "t1", "t2"}


@pytest.mark.parametrize("capacity", [0, -1, 2.5, True])
def test_bad_capacity_raises(capacity: object) -> None:
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(capacity, seed=0)  # type: ignore[arg-type]


def test_bad_sample_size_and_empty_buffer_raise() -> None:
    with pytest.raises(ValueError, match="empty"):
        ReplayBuffer(4, seed=0).sample(1)
    for n in (0, -2):
        with pytest.raises(ValueError, match="sample size"):
            _filled(seed=0).sample(n)


def test_state_round_trip_resumes_the_same_stream() -> None:
    # Run A uninterrupted; run B saves after a few draws, reloads into a fresh buffer (through torch.save,
    # as a checkpoint would) and must continue with the same draws and the same evictions.
    a = _filled(seed=3, capacity=8)
    a.add([_traj(99, failed=True)])
    a.sample(3)
    blob = io.BytesIO()
    torch.save(a.state_dict(), blob)
    blob.seek(0)
    resumed = ReplayBuffer(capacity=8, seed=12345)  # the seed is irrelevant once the RNG state is loaded
    resumed.load_state_dict(torch.load(blob, weights_only=True))  # plain data: no code can run
    assert len(resumed) == len(a) and resumed.num_skipped == 1
    for step in range(4):
        a.add([_traj(100 + step)])
        resumed.add([_traj(100 + step)])
        assert _ids(a.sample(5)) == _ids(resumed.sample(5))
    assert sorted(_ids(a.sample(8))) == sorted(_ids(resumed.sample(8)))


def test_load_into_smaller_buffer_keeps_newest_and_rejects_bad_state() -> None:
    small = ReplayBuffer(capacity=2, seed=0)
    small.load_state_dict(_filled(seed=0, n=5).state_dict())
    assert sorted(_ids(small.sample(2))) == ["t3", "t4"]
    with pytest.raises(ValueError, match="missing"):
        small.load_state_dict({"items": []})
    with pytest.raises(ValueError, match="plain Trajectory"):
        small.load_state_dict({"items": ["x"], "rng_state": small.state_dict()["rng_state"]})


def test_state_is_plain_data_and_round_trips_every_field_exactly() -> None:
    """Turns, failures, reward terms, routing and awkward floats survive ``weights_only=True`` unchanged."""
    from harmonyrl.types import Message, Routing, Turn

    call = Message("assistant", '{"x": 1}', "commentary", recipient="functions.calc", content_type="json")
    obs = Message("tool", "é\ud800", "commentary", recipient="assistant", name="functions.calc")
    full = Trajectory(
        task_id="t",
        group_id=3,
        token_ids=(5, 6, 7),
        loss_mask=(0, 1, 1),
        sampler_logprobs=(-0.0, 5e-324, -1.0000000000000002),
        reward=0.1 + 0.2,
        terminated=False,
        truncated=True,
        failure=None,
        turns=(Turn((call,), None, (obs,), 0.25, 1e-9), Turn((), "bad: header", (), 0.5, 0.0)),
        parity_mismatches=1,
        reward_terms={"format": 0.5},
        routing=Routing(torch.tensor([[[1, 2]], [[0, 3]], [[-1, -1]]], dtype=torch.int8)),
        task_prompt="What is 1 + 1? ✓",
        expected_answer="2",
    )
    buf = ReplayBuffer(capacity=4, seed=0)
    buf.add([full, _traj(1)])
    blob = io.BytesIO()
    torch.save(buf.state_dict(), blob)
    blob.seek(0)
    back = ReplayBuffer(capacity=4, seed=0)
    back.load_state_dict(torch.load(blob, weights_only=True))
    assert list(back._items) == [full, _traj(1)]
    got = back._items[0].sampler_logprobs
    assert [x.hex() for x in got] == [x.hex() for x in full.sampler_logprobs]  # bit for bit, -0.0 included
