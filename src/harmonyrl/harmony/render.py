"""Messages → token ids in the harmony format, id-for-id identical to openai-harmony.

Header layout (as openai-harmony renders it; each text piece is encoded separately, which matters for ids)::

    <|start|>{role | tool name}[ to={recipient}][<|channel|>{channel}][ <|constrain|>{type}]<|message|>
    {content}{<|call|> if an assistant message has a recipient else <|end|>}

So a tool call in history is::

    <|start|>assistant to=functions.calculator<|channel|>commentary <|constrain|>json<|message|>{...}<|call|>

(recipient *before* the channel) and a tool result is::

    <|start|>functions.calculator to=assistant<|channel|>commentary<|message|>...<|end|>

A final answer in history ends with ``<|end|>``.

:func:`render_conversation` mirrors ``render_conversation`` with the default ``auto_drop_analysis``: when the
last assistant message is on ``final``, analysis messages *before the first final message* are dropped (the
chain of thought of finished turns is not shown again). :func:`render_completion` renders one assistant turn
as sampled after ``<|start|>assistant``: the same bytes as history except the closing ``<|return|>`` of a
final answer, so ``render_prompt(h) + render_completion(turn)`` equals openai-harmony's
``render_conversation_for_training(h + turn)`` when nothing is dropped. That identity is what lets the
SFT trainer build targets and the agent loop check parity of re-rendered sampled turns.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from harmonyrl.harmony.schema import tools_section
from harmonyrl.harmony.tokenizer import Codec
from harmonyrl.types import CHANNELS, Channel, Message, Role, ToolSpec

DEFAULT_MODEL_IDENTITY = "You are ChatGPT, a large language model trained by OpenAI."
DEFAULT_KNOWLEDGE_CUTOFF = "2024-06"


def system_message(
    reasoning: Literal["low", "medium", "high"] = "low",
    *,
    model_identity: str | None = DEFAULT_MODEL_IDENTITY,
    knowledge_cutoff: str | None = DEFAULT_KNOWLEDGE_CUTOFF,
    conversation_start_date: str | None = None,
    function_tools: bool = False,
    channels: Sequence[Channel] = CHANNELS,
) -> Message:
    """The system message, formatted exactly as openai-harmony's ``SystemContent``.

    ``function_tools`` must be True when the developer message declares function tools: openai-harmony then
    adds the line routing tool calls to the commentary channel (it decides from the whole conversation; our
    messages carry finished text, so the caller says it). Pass ``None`` to omit identity / cutoff and save
    tokens for tiny models.
    """
    sections: list[str] = []
    top = [model_identity] if model_identity is not None else []
    if knowledge_cutoff is not None:
        top.append(f"Knowledge cutoff: {knowledge_cutoff}")
    if conversation_start_date is not None:
        top.append(f"Current date: {conversation_start_date}")
    if top:
        sections.append("\n".join(top))
    sections.append(f"Reasoning: {reasoning}")
    if channels:
        header = f"# Valid channels: {', '.join(channels)}. Channel must be included for every message."
        if function_tools:
            header += "\nCalls to these tools must go to the commentary channel: 'functions'."
        sections.append(header)
    return Message(role="system", content="\n\n".join(sections))


def developer_message(instructions: str, tools: Sequence[ToolSpec]) -> Message:
    """The developer message: ``# Instructions`` then the ``functions`` namespace (openai-harmony's layout).

    Empty ``instructions`` omits the instructions section; no tools omits the tools section.
    """
    sections: list[str] = []
    if instructions:
        sections += ["# Instructions", instructions]
    if tools:
        sections.append(tools_section(tools))
    return Message(role="developer", content="\n\n".join(sections))


def _header_tail(codec: Codec, msg: Message, recipient_after_channel: bool = False) -> list[int]:
    """Header after the role: recipient, channel, constrained content type, then ``<|message|>``."""
    sp = codec.special
    ids: list[int] = []
    to = msg.recipient is not None and msg.recipient != "all"
    if to and not recipient_after_channel:
        ids += codec.encode(f" to={msg.recipient}")
    if msg.channel is not None:
        ids += [sp.channel, *codec.encode(msg.channel)]
    if to and recipient_after_channel:
        ids += codec.encode(f" to={msg.recipient}")
    if msg.content_type is not None:
        ids += [*codec.encode(" "), sp.constrain, *codec.encode(msg.content_type)]
    return [*ids, sp.message]


def _author(codec: Codec, msg: Message) -> list[int]:
    if msg.role == "tool":
        if not msg.name:
            raise ValueError("a tool message needs name='functions.<tool>'")
        return codec.encode(msg.name)
    ids = codec.encode(msg.role)
    return ids + codec.encode(f":{msg.name}") if msg.name else ids


def _terminator(codec: Codec, msg: Message) -> int:
    if msg.role == "assistant" and msg.recipient is not None:
        return codec.special.call
    return codec.special.end


def render_message(codec: Codec, msg: Message) -> list[int]:
    """One message as it appears in a conversation (history form: final answers end with ``<|end|>``)."""
    body = [*_header_tail(codec, msg), *codec.encode(msg.content), _terminator(codec, msg)]
    return [codec.special.start, *_author(codec, msg), *body]


def _kept(messages: Sequence[Message], drop_analysis: bool) -> list[Message]:
    """openai-harmony's ``auto_drop_analysis`` rule (see module docstring)."""
    last_assistant = next((m for m in reversed(messages) if m.role == "assistant"), None)
    if not drop_analysis or last_assistant is None or last_assistant.channel != "final":
        return list(messages)
    first_final = next((i for i, m in enumerate(messages) if m.channel == "final"), None)
    if first_final is None:
        return list(messages)
    return [m for i, m in enumerate(messages) if not (i < first_final and m.channel == "analysis")]


def render_conversation(codec: Codec, messages: Sequence[Message], *, drop_analysis: bool = True) -> list[int]:
    """Messages in history form, as openai-harmony's ``render_conversation`` (default config)."""
    out: list[int] = []
    for msg in _kept(messages, drop_analysis):
        out += render_message(codec, msg)
    return out


def render_prompt(
    codec: Codec, messages: Sequence[Message], next_role: Role = "assistant", *, drop_analysis: bool = True
) -> list[int]:
    """Prompt for sampling: conversation + ``<|start|>{next_role}`` (render_conversation_for_completion)."""
    return [
        *render_conversation(codec, messages, drop_analysis=drop_analysis),
        codec.special.start,
        *codec.encode(next_role),
    ]


def render_completion(codec: Codec, messages: Sequence[Message], *, recipient_after_channel: bool = False) -> list[int]:
    """One assistant turn as the model samples it after the prompt's ``<|start|>assistant``.

    Messages after the first get their own ``<|start|>assistant``. Tool calls end with ``<|call|>``; a final
    message that closes the turn ends with ``<|return|>``; anything else with ``<|end|>``.
    ``recipient_after_channel=True`` puts `` to=...`` after the channel, the order GPT-OSS checkpoints tend to
    sample (``<|channel|>commentary to=functions.x <|constrain|>json``); the parser accepts both.
    """
    sp = codec.special
    out: list[int] = []
    for i, msg in enumerate(messages):
        if msg.role != "assistant":
            raise ValueError(f"render_completion takes assistant messages only, got {msg.role!r}")
        if msg.name is not None:
            raise ValueError("assistant messages carry no author name in harmonyrl")
        if i > 0:
            out += [sp.start, *_author(codec, msg)]
        out += _header_tail(codec, msg, recipient_after_channel)
        out += codec.encode(msg.content)
        last_final = i == len(messages) - 1 and msg.channel == "final" and msg.recipient is None
        out.append(sp.return_ if last_final else _terminator(codec, msg))
    return out


def render_training(codec: Codec, messages: Sequence[Message], *, drop_analysis: bool = True) -> list[int]:
    """Conversation whose closing final answer ends in ``<|return|>`` (render_conversation_for_training)."""
    out = render_conversation(codec, messages, drop_analysis=drop_analysis)
    if messages and messages[-1].role == "assistant" and messages[-1].channel == "final" and out:
        out[-1] = codec.special.return_
    return out
