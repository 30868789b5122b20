"""Train the project tokenizer and write ``src/harmonyrl/data/tokenizer.json``. Deterministic.

    python scripts/train_tokenizer.py              # writes the shipped file
    python scripts/train_tokenizer.py --out /tmp/x  # writes /tmp/x/tokenizer.json

Corpus (fixed order, fixed seeds): harmony-rendered calculator conversations — taken from
``harmonyrl.tasks.calculator`` when importable, else from a built-in generator of the same shape — plus a
small built-in English/JSON text so that free text in other envs does not fall back to single bytes.
The conversations are rendered with the real renderer through a recording codec, so BPE sees exactly the
text pieces the renderer encodes (each header piece and each content string separately).
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Iterator, Sequence
from pathlib import Path

from harmonyrl.harmony.render import (
    DEFAULT_MODEL_IDENTITY,
    developer_message,
    render_completion,
    render_prompt,
    system_message,
)
from harmonyrl.harmony.tokenizer import (
    DEFAULT_VOCAB_SIZE,
    HarmonyTokenizer,
    SpecialIds,
    build_trainer_pipeline,
    pad_to_size,
)
from harmonyrl.types import Message, ToolSpec

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "src" / "harmonyrl" / "data"

ENGLISH = """\
The quick brown fox jumps over the lazy dog. A tool is a function the model can call; its result comes back
as a message from the tool. Think step by step, then give the final answer. The answer is the number that
the calculator returned. If the tool fails, read the error and try again with a corrected expression.
You are a helpful assistant. Answer the question with only the number. Use the tool to compute the value.
What is the sum of these numbers? Compute the product, then add the remainder. Evaluate the expression.
Reasoning effort can be low, medium or high. Messages have a role, a channel, a recipient and content.
Write a short function in Python that returns the result. The test checks that the output is correct.
Please follow the instructions carefully and check your work before answering. This is an example of
plain English text so the tokenizer learns common words: the, of, and, to, in, is, that, for, it, with,
as, was, on, be, at, by, this, have, from, or, one, had, not, but, what, all, were, when, we, there, can,
an, your, which, their, said, if, do, will, each, about, how, up, out, them, then, she, many, some, so,
these, would, other, into, has, more, her, two, like, him, see, time, could, no, make, than, first, been,
its, who, now, people, my, made, over, did, down, only, way, find, use, may, water, long, little, very,
after, words, called, just, where, most, know, get, through, back, much, before, go, good, new, write.
Our small village sits between a river and a forest. Every morning the baker opens her shop, the farmers
bring vegetables to the market, and children walk to school along the old stone bridge. In winter the
river freezes and people skate on it; in summer they swim, fish and sail small boats. History teaches
us that cities grow around trade, water and safety. Science explains how energy, matter and information
behave, while mathematics gives precise language for quantities, shapes, patterns and change. Numbers
can be added, subtracted, multiplied and divided; a fraction has a numerator and a denominator, and a
negative number is smaller than zero. Multiplication distributes over addition. Division by zero is
undefined, so a careful program reports an error instead of crashing. The weather today is sunny with a
light breeze, although clouds may arrive this evening and bring rain tomorrow. Students should review
their notes, practise problems and ask questions whenever something seems unclear or surprising.
Computers store everything as bytes. A compiler translates source code into instructions; an interpreter
executes them directly. Good software is tested, documented, readable and maintained by a community.
Networks connect machines; servers answer requests from clients; databases keep records consistent.
Language models predict the next token given previous tokens, and reinforcement learning improves a
policy by rewarding successful behaviour. An agent observes its environment, chooses actions, receives
rewards and updates its strategy. Training requires data, patience, compute and well designed experiments.
def add(a: int, b: int) -> int:
    return a + b
for i in range(10):
    if i % 2 == 0:
        print(f"even {i}")
    else:
        total += i
class Point:
    def __init__(self, x: float, y: float) -> None:
        self.x = x
        self.y = y
import json, math, random
result = math.sqrt(16) + json.loads("[1, 2, 3]")[0]
"""

JSON_SNIPPETS = (
    '{"result": 10907}',
    '{"error": "division by zero"}',
    '{"expression": "347 * 28 + 1191"}',
    '{"name": "calculator", "arguments": {"expression": "12 + 30"}}',
    '{"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}',
    '[{"id": 1, "ok": true, "value": null}, {"id": 2, "ok": false, "value": 3.5}]',
)


class _Recorder:
    """A :class:`~harmonyrl.harmony.tokenizer.Codec` that records the text pieces the renderer encodes."""

    special = SpecialIds(start=-1, end=-2, message=-3, channel=-4, constrain=-5, call=-6, return_=-7, endoftext=-8)
    vocab_size = 0

    def __init__(self) -> None:
        self.pieces: list[str] = []

    def encode(self, text: str) -> list[int]:
        self.pieces.append(text)
        return []

    def decode(self, ids: Sequence[int]) -> str:
        return ""

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        return b""

    def is_special(self, token_id: int) -> bool:
        return token_id < 0


def _fallback_episodes(seed: int, n: int) -> Iterator[tuple[str, list[ToolSpec], list[Message]]]:
    """Calculator-like episodes when ``harmonyrl.tasks.calculator`` is not available."""
    rng = random.Random(seed)
    tool = ToolSpec(
        "calculator",
        "Evaluate integer arithmetic exactly.",
        {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": 'For example "347 * 28 + 1191".'}},
            "required": ["expression"],
        },
    )
    instructions = "Solve the arithmetic problem. Use the calculator tool, then answer with only the number."
    for _ in range(n):
        a, b, c = rng.randint(10, 999), rng.randint(10, 99), rng.randint(100, 9999)
        op = rng.choice(("+", "-"))
        expr = f"{a} * {b} {op} {c}"
        value = a * b + c if op == "+" else a * b - c
        user = Message("user", f"{rng.choice(('What is', 'Compute', 'Evaluate'))} {expr}?")
        demo = [
            Message(
                "assistant",
                json.dumps({"expression": expr}),
                "commentary",
                "functions.calculator",
                content_type="json",
            ),
            Message("tool", json.dumps({"result": value}), "commentary", "assistant", "functions.calculator"),
            Message("assistant", str(value), "final"),
        ]
        yield instructions, [tool], [user, *demo]


def _episodes(seed: int, n: int) -> Iterator[tuple[str, list[ToolSpec], list[Message]]]:
    try:
        from harmonyrl.tasks.calculator import CalculatorFactory, expert_demo
    except ImportError:
        yield from _fallback_episodes(seed, n)
        return
    factory = CalculatorFactory(seed=seed)
    rng = random.Random(seed)
    for task in list(factory.tasks("train"))[:n]:
        env = factory.make(task)
        user = Message("user", task.prompt)
        yield env.instructions, list(env.tools), [user, *expert_demo(task, rng, p_tool=0.6)]  # the corpus's mix


def corpus(seed: int = 0, n_conversations: int = 2000) -> list[str]:
    """The training texts, in a fixed order."""
    texts: list[str] = [*ENGLISH.split("\n"), *JSON_SNIPPETS]
    for i, (instructions, tools, turn) in enumerate(_episodes(seed, n_conversations)):
        rec = _Recorder()
        # Alternate full and minimal system messages: both are plausible prompts for tiny models.
        identity = None if i % 2 else DEFAULT_MODEL_IDENTITY
        system = system_message(function_tools=bool(tools), model_identity=identity)
        history = [system, developer_message(instructions, tools), turn[0]]
        render_prompt(rec, history)
        # Split the assistant side into sampled turns (each ends at a tool call or the final answer).
        start = 1
        for j in range(1, len(turn)):
            if turn[j].role == "assistant" and (turn[j].is_tool_call or turn[j].channel == "final"):
                render_completion(rec, turn[start : j + 1])
                if j + 1 < len(turn):
                    render_prompt(rec, [turn[j + 1]])
                start = j + 2
        if i % 4 == 0:  # the calculator expert does not think aloud; other envs' models will
            render_completion(rec, [Message("assistant", "I should use the calculator tool.", "analysis")])
        texts.extend(rec.pieces)
    return [t for t in texts if t]


def train(seed: int = 0, n_conversations: int = 2000, vocab_size: int = DEFAULT_VOCAB_SIZE) -> HarmonyTokenizer:
    tok, trainer = build_trainer_pipeline(vocab_size)
    tok.train_from_iterator(corpus(seed, n_conversations), trainer=trainer)
    return HarmonyTokenizer(pad_to_size(tok, vocab_size))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="directory for tokenizer.json")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n-conversations", type=int, default=2000)
    parser.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE)
    args = parser.parse_args(argv)
    tok = train(args.seed, args.n_conversations, args.vocab_size)
    path = tok.save(args.out)
    print(f"wrote {path} (vocab {tok.vocab_size})")


if __name__ == "__main__":
    main()
