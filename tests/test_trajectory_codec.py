"""Every path that stores a trajectory gives back the trajectory it was given, with every field set.

Trajectories are generated with every field non-default (policy versions, routing in both dtypes, failures,
reward terms including a team role, tool messages with every message field), then sent through: the codec
itself; the replay buffer's checkpoint state (through ``torch.save`` / ``torch.load(weights_only=True)``, as a
resume reads it); the rollout store's parquet file; and the readable episodes file, for the fields it keeps.
Before the one codec, the replay buffer dropped ``policy_version`` (a resumed off-policy run trained every old
episode as version 0) while its own round-trip test, written without that field, passed.
"""

from __future__ import annotations

import io
import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from fuzz_settings import fuzz
from harmonyrl.rl.replay_buffer import ReplayBuffer
from harmonyrl.rollout.store import read_step, write_step
from harmonyrl.telemetry.episodes import append_episodes, iter_episodes
from harmonyrl.trajectory_codec import TRAJECTORY_FIELDS, trajectory_from_plain, trajectory_to_plain
from harmonyrl.types import ENV_FAILURE_KINDS, ROLE_TERM, Failure, Message, Routing, Trajectory, Turn

text = st.text(max_size=12)
finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
maybe_text = st.none() | text


@st.composite
def messages(draw: st.DrawFn) -> Message:
    role = draw(st.sampled_from(["system", "developer", "user", "assistant", "tool"]))
    channel = draw(st.none() | st.sampled_from(["analysis", "commentary", "final"]))
    return Message(role, draw(text), channel, draw(maybe_text), draw(maybe_text), draw(maybe_text))


@st.composite
def turns(draw: st.DrawFn) -> Turn:
    sampled = tuple(draw(st.lists(messages(), min_size=1, max_size=2)))
    observations = tuple(draw(st.lists(messages(), max_size=2)))
    return Turn(sampled, draw(maybe_text), observations, draw(finite), draw(finite))


@st.composite
def trajectories(draw: st.DrawFn, failures: bool = True) -> Trajectory:
    length = draw(st.integers(1, 12))
    ids = tuple(draw(st.lists(st.integers(0, 200_000), min_size=length, max_size=length)))
    mask = tuple(draw(st.lists(st.integers(0, 1), min_size=length, max_size=length)))
    logprobs = tuple(draw(st.lists(finite, min_size=length, max_size=length)))
    dtype = draw(st.sampled_from([torch.int8, torch.int16]))
    layers, k = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    high = 127 if dtype == torch.int8 else 4000
    routing = torch.randint(-1, high, (length, layers, k), generator=torch.Generator().manual_seed(length)).to(dtype)
    kind = draw(st.sampled_from(sorted(ENV_FAILURE_KINDS))) if failures and draw(st.booleans()) else None
    terms = draw(st.dictionaries(st.sampled_from(["correct", "format", "tool_use", ROLE_TERM]), finite, min_size=1))
    return Trajectory(
        task_id=draw(text),
        group_id=draw(st.integers(0, 10_000)),
        token_ids=ids,
        loss_mask=mask,
        sampler_logprobs=logprobs,
        reward=draw(finite),
        terminated=draw(st.booleans()),
        truncated=draw(st.booleans()),
        failure=None if kind is None else Failure(kind, draw(text)),  # type: ignore[arg-type]
        turns=tuple(draw(st.lists(turns(), min_size=1, max_size=3))),
        parity_mismatches=draw(st.integers(1, 50)),
        reward_terms=terms,
        routing=Routing(routing),
        policy_version=draw(st.integers(1, 10_000)),
        task_prompt=draw(text),
        expected_answer=draw(text),
        token_versions=tuple(draw(st.lists(st.integers(-1, 10_000), min_size=length, max_size=length))),
    )


@fuzz(20)
@given(trajectories(failures=False))
def test_the_generator_sets_every_field(example: Trajectory) -> None:
    """A field a new test generator left at its default would be a field no round trip below checks."""
    defaults = Trajectory("", 0, (), (), (), 0.0, False, False, None, ())
    unset = [n for n in TRAJECTORY_FIELDS if getattr(example, n) == getattr(defaults, n) and n not in _MAY_MATCH]
    assert not unset, unset


_MAY_MATCH = {"task_id", "group_id", "reward", "terminated", "truncated", "failure", "task_prompt", "expected_answer"}
"""Fields whose random draw may equal the default (an empty string, 0, False) on some example."""


@fuzz(150)
@given(trajectories())
def test_codec_round_trips_every_field(traj: Trajectory) -> None:
    assert trajectory_from_plain(trajectory_to_plain(traj)) == traj


@fuzz(60)
@given(st.lists(trajectories(failures=False), min_size=1, max_size=4))
def test_replay_buffer_state_round_trips_every_field(trajs: list[Trajectory]) -> None:
    buffer = ReplayBuffer(capacity=10, seed=0)
    buffer.add(trajs)
    blob = io.BytesIO()
    torch.save(buffer.state_dict(), blob)
    blob.seek(0)
    restored = ReplayBuffer(capacity=10, seed=0)
    restored.load_state_dict(torch.load(blob, weights_only=True))
    assert restored.sample(len(trajs)) == buffer.sample(len(trajs))
    assert sorted(restored.sample(len(trajs)), key=repr) == sorted(trajs, key=repr)


@fuzz(40)
@given(st.lists(trajectories(), min_size=1, max_size=4))
def test_rollout_store_round_trips_every_field(
    tmp_path_factory: pytest.TempPathFactory, trajs: list[Trajectory]
) -> None:
    path = tmp_path_factory.mktemp("store") / "step_00001.parquet"
    write_step(path, 1, trajs)
    assert read_step(path) == trajs


@fuzz(40)
@given(st.lists(trajectories(), min_size=1, max_size=4))
def test_episodes_file_keeps_what_a_person_reads(
    tmp_path_factory: pytest.TempPathFactory, trajs: list[Trajectory]
) -> None:
    path = tmp_path_factory.mktemp("episodes") / "episodes.jsonl"
    append_episodes(path, trajs, step=3)
    for traj, line in zip(trajs, iter_episodes(path), strict=True):
        assert (line["task_id"], line["prompt"], line["expected_answer"]) == (
            traj.task_id, traj.task_prompt, traj.expected_answer)  # fmt: skip
        assert line["reward"] == traj.reward and line["reward_terms"] == traj.reward_terms
        assert line["failure"] == (None if traj.failure is None else traj.failure.kind)
        for turn, record in zip(traj.turns, line["turns"], strict=True):
            assert record["parse_error"] == turn.parse_error
            assert [m["content"] for m in record["sampled"]] == [m.content for m in turn.sampled]
            assert [m["content"] for m in record["observations"]] == [m.content for m in turn.observations]
            assert [m.get("name") for m in record["observations"]] == [m.name for m in turn.observations]
        assert line.get("versions", []) == sorted({v for v in traj.token_versions if v >= 0})


@fuzz(10)
@given(trajectories(failures=False))
def test_a_record_without_a_later_field_reads_with_its_default(traj: Trajectory) -> None:
    """A checkpoint written before ``policy_version`` / ``task_prompt`` existed still resumes."""
    plain = trajectory_to_plain(traj)
    for name in ("policy_version", "task_prompt", "expected_answer", "routing", "token_versions"):
        del plain[name]
    back = trajectory_from_plain(plain)
    assert (back.policy_version, back.task_prompt, back.routing, back.token_versions) == (0, "", None, ())


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("token_ids", ["1"], TypeError),
        ("failure", ["tool_timeout"], TypeError),
        ("routing", [[1]], TypeError),
        ("terminated", 1, TypeError),
        ("group_id", None, TypeError),
    ],
)
@fuzz(5)
@given(traj=trajectories(failures=False))
def test_malformed_records_are_refused(field: str, value: object, error: type[Exception], traj: Trajectory) -> None:
    plain = trajectory_to_plain(traj)
    plain[field] = value
    with pytest.raises(error):
        trajectory_from_plain(plain)
    del plain[field]
    if field in ("token_ids", "terminated", "group_id"):  # required: no default to fall back on
        with pytest.raises(KeyError, match=field):
            trajectory_from_plain(plain)


@fuzz(20)
@given(trajectories())
def test_plain_records_are_json_apart_from_routing(traj: Trajectory) -> None:
    plain = trajectory_to_plain(traj)
    plain.pop("routing")
    assert json.loads(json.dumps(plain)) == plain
