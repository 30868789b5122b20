"""The demonstration file schema: field for field a ``Message``, and the shape the renderer and the SFT mask need."""

from __future__ import annotations

import pydantic
import pytest

from harmonyrl.envs.tools import observation
from harmonyrl.harmony.demo_schema import DemoConversation
from harmonyrl.types import Message

USER = {"role": "user", "content": "Evaluate 2 + 3."}
CALL = {
    "role": "assistant",
    "channel": "commentary",
    "recipient": "functions.calculator",
    "content_type": "json",
    "content": '{"expression": "2 + 3"}',
}
RESULT = {
    "role": "tool",
    "name": "functions.calculator",
    "recipient": "assistant",
    "channel": "commentary",
    "content": '{"result": 5}',
}
FINAL = {"role": "assistant", "channel": "final", "content": "5"}


def test_messages_convert_field_for_field() -> None:
    conv = DemoConversation.model_validate({"task_id": "t", "messages": [USER, CALL, RESULT, FINAL]})
    prompt, turns = conv.split()
    assert prompt == [Message("user", "Evaluate 2 + 3.")]
    assert turns[0].is_tool_call and turns[0].tool_name == "calculator"
    assert turns[1] == observation("calculator", '{"result": 5}')  # what the env's tools append
    assert turns[2] == Message("assistant", "5", channel="final")
    again = DemoConversation.from_messages([*prompt, *turns], "t")
    assert again == conv
    assert again.model_dump(exclude_none=True) == {"task_id": "t", "messages": [USER, CALL, RESULT, FINAL]}


@pytest.mark.parametrize(
    ("messages", "error"),
    [
        ([USER], "no assistant message"),
        ([USER, CALL, {**RESULT, "name": None}, FINAL], "a tool message needs name"),
        ([USER, {**FINAL, "name": "bob"}], "an assistant message carries no name"),
        ([USER, {"role": "assistant", "channel": "analysis", "content": "hm"}, RESULT, FINAL], "follows no tool call"),
        ([USER, FINAL, USER, FINAL], "a user message after the first assistant message"),
        ([RESULT, FINAL], "a tool message before the first assistant message"),
        ([USER, {"role": "assistant", "channel": "analysis", "content": "hm"}], "the last message must be"),
        ([USER, {**FINAL, "reciptient": "x"}], "Extra inputs are not permitted"),
        ([USER, {**FINAL, "role": "robot"}], "Input should be 'system'"),
        ([USER, {**FINAL, "channel": "chat"}], "Input should be 'analysis'"),
    ],
)
def test_a_conversation_of_the_wrong_shape_is_refused(messages: list[dict[str, object]], error: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=error):
        DemoConversation.model_validate({"messages": messages})
