"""The harmony chat format: tokenizers (codecs), rendering messages to ids and parsing sampled ids back."""

from harmonyrl.harmony.parse import ParseError, ParseErrorKind, ParseResult, parse_completion
from harmonyrl.harmony.render import (
    developer_message,
    render_completion,
    render_conversation,
    render_message,
    render_prompt,
    render_training,
    system_message,
)
from harmonyrl.harmony.tokenizer import Codec, HarmonyTokenizer, O200kCodec, SpecialIds

__all__ = [
    "Codec",
    "HarmonyTokenizer",
    "O200kCodec",
    "ParseError",
    "ParseErrorKind",
    "ParseResult",
    "SpecialIds",
    "developer_message",
    "parse_completion",
    "render_completion",
    "render_conversation",
    "render_message",
    "render_prompt",
    "render_training",
    "system_message",
]
