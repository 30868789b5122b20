"""Do an environment's prompts fit the episode's token budget? Checked before any compute is spent.

An episode whose rendered prompt (system + developer with tool declarations + the task) leaves no room under
``rollout.max_seq_len`` ends truncated before the model acts, and one that leaves less than a turn's
``max_new_tokens`` cannot finish its first message: either way it scores 0 for reasons the policy cannot
change. That is a configuration mistake worth a warning up front, not a silent ``rollout/truncated_rate``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harmonyrl.envs.base import EnvFactory
from harmonyrl.harmony.render import render_prompt
from harmonyrl.harmony.tokenizer import Codec
from harmonyrl.rollout.agent_loop import initial_messages
from harmonyrl.types import Task


async def prompt_lengths(factory: EnvFactory, codec: Codec, tasks: Sequence[Task]) -> list[int]:
    """Token length of each task's first prompt, rendered exactly as the agent loop renders it.

    A task whose env fails to make, reset or close is left out: in a rollout that is a masked ``env_error`` of
    one episode, and this advisory check must not turn it into a run that cannot start."""
    lengths = []
    for task in tasks:
        try:
            env = factory.make(task)
            try:
                messages = initial_messages(env, await env.reset())
            finally:
                await env.close()
        except Exception:
            continue
        lengths.append(len(render_prompt(codec, messages, next_role="assistant")))
    return lengths


@dataclass(frozen=True)
class PromptFit:
    checked: int
    longest: int
    no_room: int
    """Prompts with no token left to generate."""
    short_room: int
    """Prompts leaving some room, but less than one turn's ``max_new_tokens``."""

    def warning(self, max_seq_len: int, max_new_tokens: int) -> str | None:
        """One line for the user, or None when every checked prompt leaves a full turn of room."""
        if not self.no_room and not self.short_room:
            return None
        suggest = -(-(self.longest + 4 * max_new_tokens) // 256) * 256  # room for a few turns, rounded up
        return (
            f"{self.no_room + self.short_room} of {self.checked} checked prompts (longest {self.longest} tokens) "
            f"leave less than max_new_tokens={max_new_tokens} of rollout.max_seq_len={max_seq_len}"
            f"{f' ({self.no_room} leave none)' if self.no_room else ''}: those episodes end truncated whatever "
            f"the model does; try rollout.max_seq_len={suggest}"
        )


def prompt_fit(lengths: Sequence[int], max_seq_len: int, max_new_tokens: int) -> PromptFit:
    """Classify prompt ``lengths`` against the episode budget (see :class:`PromptFit`)."""
    room = [max_seq_len - n for n in lengths]
    return PromptFit(
        checked=len(lengths),
        longest=max(lengths, default=0),
        no_room=sum(r <= 0 for r in room),
        short_room=sum(0 < r < max_new_tokens for r in room),
    )


async def check_prompt_fit(
    factory: EnvFactory, codec: Codec, max_seq_len: int, max_new_tokens: int, per_split: int = 32
) -> str | None:
    """The :meth:`PromptFit.warning` for the first ``per_split`` train and held-out tasks (the held-out
    evaluation uses the first tasks of its split)."""
    tasks = [*factory.tasks("train")[:per_split], *factory.tasks("test")[:per_split]]
    return prompt_fit(await prompt_lengths(factory, codec, tasks), max_seq_len, max_new_tokens).warning(
        max_seq_len, max_new_tokens
    )
