"""Id-for-id parity with openai-harmony (the reference renderer/parser) on the real o200k vocabulary."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import pytest

from harmonyrl.harmony import (
    O200kCodec,
    developer_message,
    parse_completion,
    render_completion,
    render_conversation,
    render_prompt,
    render_training,
    system_message,
)
from harmonyrl.harmony.tokenizer import O200K_HARMONY_SPECIALS
from harmonyrl.types import Message, ToolSpec

CALC = ToolSpec(
    "calculator",
    "Evaluate integer arithmetic exactly.",
    {
        "type": "object",
        "properties": {"expression": {"type": "string", "description": 'For example "347 * 28 + 1191".'}},
        "required": ["expression"],
        "additionalProperties": False,
    },
)
SEARCH = ToolSpec(
    "search",
    "Search the web.\nReturns the top results.",
    {
        "type": "object",
        "properties": {
            "query": {"type": "string", "title": "Query", "examples": ["weather", "news"]},
            "k": {"type": "integer", "default": 5, "description": "How many results"},
            "lang": {"type": "string", "enum": ["en", "fr"], "default": "en"},
            "site": {"type": "string", "default": "wikipedia.org", "nullable": True},
            "tags": {"type": "array", "items": {"type": "string"}},
            "mode": {
                "oneOf": [{"type": "string", "description": "named"}, {"type": "number"}],
                "description": "Either",
            },
            "filters": {
                "type": "object",
                "description": "Nested",
                "properties": {"after": {"type": "string"}},
            },
            "score": {"type": ["number", "null"]},
        },
        "required": ["query"],
    },
)
NOARGS = ToolSpec("now", "Current time.", {})

CALL = Message(
    "assistant",
    '{"expression": "347 * 28 + 1191"}',
    "commentary",
    "functions.calculator",
    content_type="json",
)
RESULT = Message("tool", '{"result": 10907}', "commentary", "assistant", "functions.calculator")


@dataclass
class Case:
    name: str
    tools: list[ToolSpec]
    messages: list[Message]
    instructions: str = "Solve the problem. Use the calculator, then answer with only the number."
    reasoning: Literal["low", "medium", "high"] = "low"
    system_kw: dict[str, Any] = field(default_factory=dict)


CASES = [
    Case(
        "calculator",
        [CALC],
        [
            Message("user", "What is 347 * 28 + 1191?"),
            Message("assistant", "I need the calculator.", "analysis"),
            CALL,
            RESULT,
            Message("assistant", "10907", "final"),
        ],
    ),
    Case(
        "multi_tools",
        [CALC, SEARCH, NOARGS],
        [
            Message("user", "Look up the weather, then add 2 + 2."),
            Message("assistant", '{"query": "weather"}', "commentary", "functions.search", content_type="json"),
            Message("tool", '[{"title": "Sunny"}]', "commentary", "assistant", "functions.search"),
            Message("assistant", "{}", "commentary", "functions.now"),
            Message("tool", "12:00", "commentary", "assistant", "functions.now"),
            Message("assistant", "Sunny; 4.", "final"),
        ],
        reasoning="high",
    ),
    Case(
        "no_tools",
        [],
        [Message("user", "Hello!"), Message("assistant", "Hi.", "final")],
        instructions="Be brief.",
        system_kw={"model_identity": None, "knowledge_cutoff": None},
    ),
    Case(
        "unicode",
        [CALC],
        [
            Message("user", "Combien font 2×3 ? 日本語 😀 «ok» <|call|>"),
            Message("assistant", "Réfléchissons… ∑", "analysis"),
            Message(
                "assistant",
                '{"expression": "2 * 3"}',
                "commentary",
                "functions.calculator",
                content_type="json",
            ),
            Message(
                "tool",
                '{"result": 6, "note": "très bien ✓"}',
                "commentary",
                "assistant",
                "functions.calculator",
            ),
            Message("assistant", "6 — voilà ✨", "final"),
        ],
        system_kw={"conversation_start_date": "2025-08-05"},
    ),
    Case(
        "multi_turn_drop",
        [CALC],
        [
            Message("user", "1+1?"),
            Message("assistant", "think one", "analysis"),
            Message("assistant", "2", "final"),
            Message("user", "2+2?"),
            Message("assistant", "think two", "analysis"),
            Message("assistant", "4", "final"),
        ],
        reasoning="medium",
    ),
    Case(
        "prompt_only",
        [CALC, NOARGS],
        [Message("user", "What is 12 * 12 - 44?")],
        instructions="",
        system_kw={"model_identity": "You are a tiny model.", "knowledge_cutoff": None},
    ),
    Case(
        "pending_call",
        [CALC],
        [
            Message("user", "What is 9 * 9?"),
            Message("assistant", "Use the tool.", "analysis"),
            CALL,
            RESULT,
        ],
    ),
]


def _oh_message(oh: Any, m: Message) -> Any:
    if m.role == "tool":
        msg = oh.Message.from_author_and_content(oh.Author.new(oh.Role.TOOL, m.name), m.content)
    else:
        msg = oh.Message.from_role_and_content(oh.Role(m.role), m.content)
    if m.channel:
        msg = msg.with_channel(m.channel)
    if m.recipient:
        msg = msg.with_recipient(m.recipient)
    if m.content_type:
        msg = msg.with_content_type(f"<|constrain|>{m.content_type}")
    return msg


def _oh_conversation(oh: Any, case: Case) -> Any:
    kw = {
        "model_identity": "You are ChatGPT, a large language model trained by OpenAI.",
        "knowledge_cutoff": "2024-06",
        "conversation_start_date": None,
        **case.system_kw,
    }
    sys = oh.SystemContent.new().with_reasoning_effort(oh.ReasoningEffort(case.reasoning.capitalize()))
    sys = sys.with_model_identity(kw["model_identity"]).with_knowledge_cutoff(kw["knowledge_cutoff"])
    if kw["conversation_start_date"]:
        sys = sys.with_conversation_start_date(kw["conversation_start_date"])
    dev = oh.DeveloperContent.new()
    if case.instructions:
        dev = dev.with_instructions(case.instructions)
    if case.tools:
        dev = dev.with_function_tools(
            [oh.ToolDescription.new(t.name, t.description, parameters=t.parameters or None) for t in case.tools]
        )
    head = [
        oh.Message.from_role_and_content(oh.Role.SYSTEM, sys),
        oh.Message.from_role_and_content(oh.Role.DEVELOPER, dev),
    ]
    return oh.Conversation.from_messages(head + [_oh_message(oh, m) for m in case.messages])


def _ours(case: Case) -> list[Message]:
    system = system_message(case.reasoning, function_tools=bool(case.tools), **case.system_kw)
    return [system, developer_message(case.instructions, case.tools), *case.messages]


def test_special_ids_match_openai_harmony(harmony_enc: Any) -> None:
    sp = O200K_HARMONY_SPECIALS
    for text, expected in [
        ("<|start|>", sp.start),
        ("<|end|>", sp.end),
        ("<|message|>", sp.message),
        ("<|channel|>", sp.channel),
        ("<|constrain|>", sp.constrain),
        ("<|call|>", sp.call),
        ("<|return|>", sp.return_),
        ("<|endoftext|>", sp.endoftext),
    ]:
        assert harmony_enc.encode(text, allowed_special="all") == [expected]
    assert set(harmony_enc.stop_tokens_for_assistant_actions()) == set(sp.stop_ids)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_render_matches_openai_harmony(case: Case, o200k: O200kCodec, harmony_enc: Any) -> None:
    import openai_harmony as oh

    conv = _oh_conversation(oh, case)
    ours = _ours(case)
    assert render_conversation(o200k, ours) == harmony_enc.render_conversation(conv)
    assert render_prompt(o200k, ours) == harmony_enc.render_conversation_for_completion(conv, oh.Role.ASSISTANT)
    assert render_training(o200k, ours) == harmony_enc.render_conversation_for_training(conv)


ENDS_WITH_TURN = [c for c in CASES if c.messages[-1].role == "assistant"]


@pytest.mark.parametrize("case", ENDS_WITH_TURN, ids=[c.name for c in ENDS_WITH_TURN])
def test_completion_parity_and_parse(case: Case, o200k: O200kCodec, harmony_enc: Any) -> None:
    """prompt(history) + completion(last turn) == openai-harmony's training render; both parsers agree."""
    import openai_harmony as oh

    msgs = _ours(case)
    k = len(msgs)
    while k > 0 and msgs[k - 1].role == "assistant":
        k -= 1
    history, turn = msgs[:k], msgs[k:]
    completion = render_completion(o200k, turn)
    expected = harmony_enc.render_conversation_for_training(_oh_conversation(oh, case), None)
    no_drop = render_training(o200k, msgs, drop_analysis=False)
    assert render_prompt(o200k, history, drop_analysis=False) + completion == no_drop
    if no_drop == render_training(o200k, msgs):
        assert no_drop == expected
    parsed = parse_completion(o200k, completion)
    assert parsed.error is None and list(parsed.messages) == turn
    reference = harmony_enc.parse_messages_from_completion_tokens(completion, oh.Role.ASSISTANT)
    assert [(m.channel, m.recipient, m.content[0].text) for m in reference] == [
        (m.channel, m.recipient, m.content) for m in parsed.messages
    ]


def test_o200k_codec_matches_reference_tokenizer(o200k: O200kCodec, harmony_enc: Any) -> None:
    for text in ["What is 347 * 28 + 1191?", "  spaces\n\n\ttabs", "日本語 😀 naïve", "x" * 300, ""]:
        assert o200k.encode(text) == harmony_enc.encode(text)
        assert o200k.decode(o200k.encode(text)) == text


def test_o200k_never_encodes_control_tokens(o200k: O200kCodec) -> None:
    ids = o200k.encode("<|start|>assistant<|call|>")
    assert not any(o200k.is_special(i) for i in ids)
