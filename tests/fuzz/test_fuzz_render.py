"""Fuzzed rendering boundary: random bytes, text and objects as a tool's output, into the observation the next prompt
renders (the path of the agent loop: :meth:`Tool.call` → :func:`observation` → :func:`observation_ids`).

Properties: rendering never raises; the observation's content cannot inject a control token (the only control ids
are the message's own framing) and its ids decode back to exactly the text the tool boundary produced; and where
the parser's contract covers the text (an assistant turn, e.g. the model quoting the tool's output in its answer),
render → parse gives the same message back.
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzz_settings import fuzz
from harmonyrl.envs.tools import Tool, observation
from harmonyrl.harmony import HarmonyTokenizer, O200kCodec, parse_completion, render_completion, render_message
from harmonyrl.harmony.tokenizer import Codec
from harmonyrl.rollout.agent_loop import observation_ids
from harmonyrl.types import Message


@pytest.fixture(scope="module")
def codecs() -> list[Codec]:
    pytest.importorskip("bpe_openai")
    return [HarmonyTokenizer.load_default(), O200kCodec()]


LOOK_ALIKES = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|call|>", "<|return|>",
               "<|endoftext|>", "<|reserved_200000|>", " to=functions.x", "\ufffd", "\x00", "\ud800"]  # fmt: skip
_output = st.one_of(
    st.binary(max_size=300),  # bytes a program wrote: invalid UTF-8 included
    st.text(max_size=300),  # lone surrogates included (os.fsdecode of bad bytes gives them)
    st.lists(st.sampled_from(LOOK_ALIKES) | st.text(max_size=5), max_size=30).map("".join),
    st.recursive(  # a structured result, shown as JSON
        st.none() | st.integers() | st.floats() | st.text(max_size=10) | st.binary(max_size=10),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
        max_leaves=8,
    ),
)


def _tool_text(value: object) -> str:
    """What the model is shown when a tool returns ``value`` (through the tool boundary)."""

    def echo() -> object:
        """Return the output under test."""
        return value

    outcome = asyncio.run(Tool.from_function(echo, max_output_chars=200).call("{}"))
    assert outcome.kind == "ok" and outcome.failure is None, outcome
    return outcome.text


@fuzz(300)
@given(value=_output)
def test_tool_output_renders_as_text_that_cannot_inject_control_tokens(codecs: list[Codec], value: object) -> None:
    text = _tool_text(value)
    assert text.encode("utf-8").decode("utf-8") == text  # valid UTF-8: the tokenizer must never choke on it
    for codec in codecs:
        obs = observation("echo", text)
        ids = observation_ids(codec, [obs])
        framing = render_message(codec, observation("echo", ""))
        own = render_message(codec, obs)
        assert ids[: len(own)] == own and own[: len(framing) - 1] == framing[:-1] and own[-1] == framing[-1]
        content = own[len(framing) - 1 : -1]
        assert not any(codec.is_special(i) for i in content), text  # a look-alike stays text
        assert codec.decode_bytes(content).decode("utf-8") == text


@fuzz(300)
@given(value=_output, channel=st.sampled_from(["final", "analysis", "commentary"]))
def test_any_tool_output_quoted_by_the_model_round_trips_through_the_parser(
    codecs: list[Codec], value: object, channel: str
) -> None:
    text = _tool_text(value)
    turn = [Message("assistant", text, channel)]  # type: ignore[arg-type]  # one of the channels
    if channel != "final":
        turn.append(Message("assistant", "done", "final"))
    for codec in codecs:
        parsed = parse_completion(codec, render_completion(codec, turn))
        assert parsed.error is None and list(parsed.messages) == turn, (text, parsed.error)


def test_a_structured_result_holding_non_utf8_bytes_is_shown_not_a_tool_crash() -> None:
    """Regression (found by the fuzzer, ``value=[b'\\x80']``): bytes that are not UTF-8 inside a structured result
    made the JSON conversion raise, so any such result was a ``tool_crash``, masking the episode."""
    assert _tool_text({"blob": b"\x80\xff", "name": b"ok"}) == '{"blob": "gP8=", "name": "b2s="}'
    assert _tool_text({"name": b"ok"}) == '{"name": "ok"}'  # UTF-8 bytes read as text, as before
