"""The file schema of a demonstration: one conversation as ``{"task_id"?: str, "messages": [...]}``.

Each message has exactly the fields of :class:`harmonyrl.types.Message` (what ``harmonyrl show`` prints as a
harmony header), so a conversation converts to and from the messages the renderer takes, field for field.
The rules checked here are the ones the renderer and the SFT loss need: a tool result names its tool, an
assistant message names no author, a conversation has a prompt (system, developer, user messages), then the
assistant's turns with the tool results between them, and it ends in a final answer or a tool call.
See docs/demonstrations.md.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator

from harmonyrl.types import Channel, Message, Role

PROMPT_ROLES: frozenset[str] = frozenset({"system", "developer", "user"})


class DemoMessage(BaseModel):
    """One harmony message, field for field :class:`harmonyrl.types.Message`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Role
    content: str
    channel: Channel | None = None
    recipient: str | None = None
    """``"functions.NAME"`` on a tool call; ``"assistant"`` on a tool result."""
    name: str | None = None
    """The author of a tool result, ``"functions.NAME"``; None for every other role."""
    content_type: str | None = None
    """The ``<|constrain|>`` value of a tool call (``"json"``)."""

    @model_validator(mode="after")
    def _author(self) -> DemoMessage:
        if self.role == "tool" and not self.name:
            raise ValueError("a tool message needs name='functions.<tool>'")
        if self.role == "assistant" and self.name is not None:
            raise ValueError("an assistant message carries no name (a tool call names its tool in 'recipient')")
        return self

    def to_message(self) -> Message:
        """The renderer's :class:`Message`."""
        return Message(self.role, self.content, self.channel, self.recipient, self.name, self.content_type)

    @classmethod
    def from_message(cls, msg: Message) -> DemoMessage:
        """The file form of a renderer :class:`Message`."""
        return cls(
            role=msg.role,
            content=msg.content,
            channel=msg.channel,
            recipient=msg.recipient,
            name=msg.name,
            content_type=msg.content_type,
        )


class DemoConversation(BaseModel):
    """A demonstration: the prompt, then the assistant's turns and the tool results between them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task_id: str | None = None
    """The id of one of the env's train tasks: its prompt then comes from ``env.reset()`` and its tool calls are
    replayed through the env's tools. Without it the conversation is rendered from its own messages."""
    messages: list[DemoMessage] = Field(min_length=1)

    @model_validator(mode="after")
    def _shape(self) -> DemoConversation:
        start = self.first_assistant
        if start is None:
            raise ValueError("no assistant message: nothing to learn from")
        for i, msg in enumerate(self.messages[:start]):
            if msg.role not in PROMPT_ROLES:
                raise ValueError(f"messages[{i}]: a {msg.role} message before the first assistant message")
        for i, msg in enumerate(self.messages[start:], start):
            if msg.role not in ("assistant", "tool"):
                raise ValueError(f"messages[{i}]: a {msg.role} message after the first assistant message")
            before = self.messages[i - 1].to_message()
            if msg.role == "tool" and not (before.is_tool_call or before.role == "tool"):
                raise ValueError(f"messages[{i}]: a tool result that follows no tool call")
        last = self.messages[-1].to_message()
        if last.role != "assistant" or not (last.is_tool_call or last.channel == "final"):
            raise ValueError("the last message must be an assistant final answer (channel 'final') or a tool call")
        return self

    @property
    def first_assistant(self) -> int | None:
        """Index of the first assistant message: the messages before it are the prompt."""
        return next((i for i, m in enumerate(self.messages) if m.role == "assistant"), None)

    def split(self) -> tuple[list[Message], list[Message]]:
        """(prompt, rest): the messages before the first assistant message, and the turns from it on."""
        start = self.first_assistant or 0
        msgs = [m.to_message() for m in self.messages]
        return msgs[:start], msgs[start:]

    @classmethod
    def from_messages(cls, messages: Sequence[Message], task_id: str | None = None) -> DemoConversation:
        """The file form of a conversation (prompt and turns) of renderer messages."""
        return cls(task_id=task_id, messages=[DemoMessage.from_message(m) for m in messages])
