"""An LLM judge (RLAIF): a harmony prompt with a rubric, sent through the :class:`~harmonyrl.engine.base.Engine`
protocol to any engine, the score parsed from the judge's ``final`` message.

The judge sees a system message, the rubric as developer instructions, and one user message holding the request and
the answer; it samples greedily (temperature 0, a fixed seed), so a verdict is a function of (prompt, answer) and
the judge's weights, and is cached on that pair: a repeat costs nothing.

A reply that does not parse is a :class:`JudgeFailure`, never a score of 0: the episode is masked (the policy is not
punished for the judge's mistake, and not rewarded either). Kinds: ``no_final`` (no ``final`` message: the reply
was malformed, ran out of tokens, or called a tool), ``no_score`` (no number in it), ``out_of_range`` (below 0 or
above ``max_score``). The first number of the final message is the score (``7``, ``7/10``, ``Score: 7``).
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

from harmonyrl.engine.base import Engine
from harmonyrl.harmony.parse import parse_completion
from harmonyrl.harmony.render import developer_message, render_prompt, system_message
from harmonyrl.harmony.tokenizer import Codec
from harmonyrl.rewards.config import JudgeConfig
from harmonyrl.types import Message, SamplingParams

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
JUDGE_SEED = 17


@dataclass(frozen=True)
class JudgeFailure:
    """A verdict that could not be read as a score: the episode is masked, not scored."""

    kind: Literal["no_final", "no_score", "out_of_range"]
    detail: str


@dataclass(frozen=True)
class Verdict:
    """The judge's score in [0, 1] (the parsed number / ``max_score``) or why there is none, and what it cost."""

    score: float | None
    failure: JudgeFailure | None
    tokens: int
    """Prompt + sampled tokens (0 for a cached verdict)."""
    seconds: float
    cached: bool = False


def judge_messages(rubric: str, max_score: int, prompt: str, answer: str) -> list[Message]:
    """The judge's conversation up to its turn: system, the rubric as developer instructions, request and answer."""
    system = system_message(model_identity=None, knowledge_cutoff=None)
    user = Message(role="user", content=f"Request:\n{prompt}\n\nAnswer:\n{answer}")
    return [system, developer_message(rubric.replace("{max_score}", str(max_score)), ()), user]


def parse_verdict(codec: Codec, ids: list[int] | tuple[int, ...], max_score: int) -> float | JudgeFailure:
    """The score in [0, 1] read from the judge's sampled ``ids``, or the :class:`JudgeFailure` that says why not."""
    parsed = parse_completion(codec, ids, lenient=True)
    finals = [m for m in parsed.messages if m.channel == "final" and m.recipient is None]
    if not finals:
        why = parsed.error.kind if parsed.error is not None else "no final message"
        return JudgeFailure("no_final", why)
    text = finals[-1].content
    number = _NUMBER.search(text)
    if number is None:
        return JudgeFailure("no_score", text[:80])
    value = float(number.group())
    if not 0 <= value <= max_score:
        return JudgeFailure("out_of_range", f"{value:g} not in [0, {max_score}]")
    return value / max_score


class Judge:
    """Scores (prompt, answer) pairs through ``engine``; verdicts are cached (LRU of ``cfg.cache_size``)."""

    def __init__(self, engine: Engine, codec: Codec, cfg: JudgeConfig) -> None:
        self.engine = engine
        self.codec = codec
        self.cfg = cfg
        self._cache: OrderedDict[tuple[str, str], Verdict] = OrderedDict()
        self.hits = 0

    async def judge(self, prompt: str, answer: str) -> Verdict:
        """The verdict on ``answer`` to ``prompt``: from the cache, else sampled and parsed."""
        key = (prompt, answer)
        if (seen := self._cache.get(key)) is not None:
            self._cache.move_to_end(key)
            self.hits += 1
            return Verdict(seen.score, seen.failure, 0, 0.0, cached=True)
        sp = self.codec.special
        ids = render_prompt(self.codec, judge_messages(self.cfg.rubric, self.cfg.max_score, prompt, answer))
        params = SamplingParams(temperature=0.0, max_new_tokens=self.cfg.max_new_tokens,
                                stop_ids=(sp.return_, sp.call), seed=JUDGE_SEED)  # fmt: skip
        t0 = time.perf_counter()
        gen = await self.engine.generate(ids, params)
        seconds = time.perf_counter() - t0
        read = parse_verdict(self.codec, gen.token_ids, self.cfg.max_score)
        verdict = (
            Verdict(None, read, len(ids) + len(gen.token_ids), seconds)
            if isinstance(read, JudgeFailure)
            else Verdict(read, None, len(ids) + len(gen.token_ids), seconds)
        )
        if self.cfg.cache_size > 0:
            self._cache[key] = verdict
            if len(self._cache) > self.cfg.cache_size:
                self._cache.popitem(last=False)
        return verdict
