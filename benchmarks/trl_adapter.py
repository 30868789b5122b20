"""What TRL's ``GRPOTrainer`` needs to train on a harmonyrl tool environment as harmonyrl rolls it out
(``benchmarks/vs_trl.py``, docs/vs_trl.md).

TRL's multi-turn tool loop (``GRPOTrainer(tools=[...])``, TRL ≥ 1.x) is token in, token out like ours: it keeps
the sampled ids, appends the ids of the tool result (rendered once through the chat template) and samples the
next turn after them, with the tool ids masked out of the loss. So it represents the calculator task faithfully
once three things are harmonyrl's:

* **the prompt** — :data:`CHAT_TEMPLATE` renders system, developer and user messages as
  :func:`~harmonyrl.harmony.render.render_prompt` does; their contents come pre-rendered from
  :func:`prompt_messages` (the same :func:`~harmonyrl.rollout.agent_loop.initial_messages` the agent loop
  uses: tool declarations included), so TRL's prompt ids equal our rollouts' id for id;
* **the tool turn** — the template renders a tool result as the agent loop appends it
  (``<|start|>functions.calculator to=assistant<|channel|>commentary<|message|>…<|end|><|start|>assistant``);
* **reading a sampled turn** — :data:`RESPONSE_TEMPLATE` (transformers' response parsing) finds our tool calls
  (recipient before or after the channel, ``<|constrain|>json``) and final answers.

The reward is harmonyrl's own: :func:`score_completion` splits TRL's completion ids into the sampled turns and the
tool results between them and replays the turns through the environment (the strict harmony parser, the same
tool, the same exact-match grading), so a completion scores what the agent loop would have given it. It also says
whether the tool results TRL inserted are the ids the agent loop would have appended (``tool_parity``).
Where the two loops can still differ (a tool call TRL's parser does not recognise ends TRL's episode, where ours
answers it with an error observation) is listed in docs/vs_trl.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from harmonyrl.envs.base import EnvFactory
from harmonyrl.harmony.parse import parse_completion
from harmonyrl.harmony.tokenizer import Codec
from harmonyrl.rollout.agent_loop import initial_messages, observation_ids
from harmonyrl.types import Task

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

CHAT_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'tool' -%}"
    "<|start|>functions.{{ m.name }} to=assistant<|channel|>commentary<|message|>{{ m.content }}<|end|>"
    "{%- elif m.role == 'assistant' and m.tool_calls -%}"
    "{%- for c in m.tool_calls -%}"
    "<|start|>assistant to=functions.{{ c.function.name }}<|channel|>commentary <|constrain|>json<|message|>"
    "{{ c.function.arguments | tojson }}<|call|>"
    "{%- endfor -%}"
    "{%- elif m.role == 'assistant' -%}"
    "<|start|>assistant<|channel|>final<|message|>{{ m.content }}<|end|>"
    "{%- else -%}"
    "<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|start|>assistant{%- endif -%}"
)
"""harmonyrl's harmony rendering as a chat template. It ignores ``tools=``: the declarations are already in the
developer message :func:`prompt_messages` gives (rendered by harmonyrl, not re-derived from TRL's JSON schema)."""

RESPONSE_TEMPLATE: dict[str, object] = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|start|>assistant",
    "fields": {
        "thinking": {"open": "<|channel|>analysis<|message|>", "close_pattern": r"<\|end\|>", "content": "text"},
        "content": {"open": "<|channel|>final<|message|>", "close_pattern": r"<\|return\|>", "content": "text"},
        "tool_calls": {
            "open_pattern": r"(?:<\|channel\|>commentary)? to=functions\.(?P<name>[A-Za-z_][\w\-]*)"
            r"(?:<\|channel\|>commentary)?(?: ?<\|constrain\|>json)?<\|message\|>",
            "close_pattern": r"<\|call\|>",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": {"name": "{name}", "arguments": "{content}"}},
        },
    },
}
"""transformers' response template (``tokenizer.response_template``) for the turns harmonyrl's models sample."""


def trl_tokenizer(checkpoint: Path) -> PreTrainedTokenizerBase:
    """The checkpoint's tokenizer (``AutoTokenizer``) with :data:`CHAT_TEMPLATE` and :data:`RESPONSE_TEMPLATE`."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.response_template = RESPONSE_TEMPLATE
    return tokenizer


async def prompt_messages(factory: EnvFactory, task: Task) -> list[dict[str, str]]:
    """The episode's opening messages (system, developer with the tool declarations, the task) as chat dicts."""
    env = factory.make(task)
    try:
        messages = initial_messages(env, await env.reset())
    finally:
        await env.close()
    return [{"role": m.role, "content": m.content} for m in messages]


@dataclass(frozen=True)
class Turns:
    """A TRL completion cut at its turn boundaries: ``sampled[i]`` is turn i as sampled (ending in a stop id
    unless cut off), ``inserted[i]`` the tool-result ids TRL put after it (one fewer than the turns, or as many
    when the completion ends on a tool result)."""

    sampled: tuple[tuple[int, ...], ...]
    inserted: tuple[tuple[int, ...], ...]


def split_turns(codec: Codec, ids: Sequence[int]) -> Turns:
    """Cut ``ids`` after each sampled ``<|call|>`` / ``<|return|>`` and after each ``<|start|>assistant`` that ends
    an inserted tool result (the rendered observation's last tokens)."""
    stops, handover = set(codec.special.stop_ids), [codec.special.start, *codec.encode("assistant")]
    sampled: list[tuple[int, ...]] = []
    inserted: list[tuple[int, ...]] = []
    i = 0
    while i < len(ids):
        j = i
        while j < len(ids) and ids[j] not in stops:
            j += 1
        sampled.append(tuple(ids[i : j + 1]))
        i = j + 1
        if i >= len(ids):
            break
        k = i
        while k < len(ids) and list(ids[k : k + len(handover)]) != handover:
            k += 1
        inserted.append(tuple(ids[i : k + len(handover)]))
        i = k + len(handover)
    return Turns(tuple(sampled), tuple(inserted))


@dataclass(frozen=True)
class Score:
    """What replaying one completion found."""

    reward: float | None
    """The environment's reward; None when the environment failed (harmonyrl masks such an episode)."""
    turns: int
    """Sampled turns the replay read."""
    tool_parity: bool
    """Every inserted tool result equals the ids the agent loop would have appended."""


async def score_completion(codec: Codec, factory: EnvFactory, task: Task, ids: Sequence[int]) -> Score:
    """Replay ``ids`` (a completion: sampled turns with tool results between them) through ``task``'s environment,
    turn by turn as :func:`~harmonyrl.rollout.agent_loop.run_episode` does: an unterminated or malformed turn
    scores 0, a tool call is stepped (the environment runs its tool), a final answer is graded. A completion
    that stops before the episode ends (a tool result with no turn after it: TRL's length or turn limit) is
    truncated: 0, as in the agent loop."""
    turns = split_turns(codec, ids)
    env = factory.make(task)
    parity = True
    try:
        await env.reset()
        for n, sampled in enumerate(turns.sampled, start=1):
            parsed = parse_completion(codec, sampled)
            if parsed.error is not None:  # cut off (length) or malformed: no reward either way
                return Score(0.0, n, parity)
            result = await env.step(parsed.messages)
            if result.failure is not None:
                return Score(None, n, parity)
            if result.terminated or result.truncated:
                return Score(result.reward, n, parity)
            if n <= len(turns.inserted):
                parity &= list(turns.inserted[n - 1]) == observation_ids(codec, result.observations)
        return Score(0.0, len(turns.sampled), parity)
    finally:
        await env.close()


class HarmonyReward:
    """A TRL reward function (``reward_funcs=[...]``): each completion's :func:`score_completion`, its task found by
    the dataset's ``task_id`` column; counts the completions whose tool results differed from the agent loop's."""

    def __init__(self, codec: Codec, factory: EnvFactory, tasks: Mapping[str, Task]) -> None:
        self.__name__ = "harmonyrl_reward"  # TRL names a reward function's metrics after it
        self._codec, self._factory, self._tasks = codec, factory, tasks
        self.scored = 0
        self.parity_failures = 0

    def __call__(
        self, completion_ids: Sequence[Sequence[int]], task_id: Sequence[str], **_: object
    ) -> list[float | None]:
        """One reward per completion (TRL passes the other columns and its own arguments as keywords)."""
        pairs = list(zip(completion_ids, task_id, strict=True))

        async def score_all() -> list[Score]:
            jobs = (score_completion(self._codec, self._factory, self._tasks[t], ids) for ids, t in pairs)
            return list(await asyncio.gather(*jobs))

        scores = asyncio.run(score_all())
        self.scored += len(scores)
        self.parity_failures += sum(not s.tool_parity for s in scores)
        return [s.reward for s in scores]
