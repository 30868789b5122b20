"""Do an environment's prompts fit the episode's token budget? Checked before any compute is spent.

An episode whose rendered prompt (system + developer with tool declarations + the task) leaves no room under
``rollout.max_seq_len`` ends truncated before the model acts, and one that leaves less than a turn's
``max_new_tokens`` cannot finish its first message: either way it scores 0 for reasons the policy cannot
change. That is a configuration mistake worth a warning up front, not a silent ``rollout/truncated_rate``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import Console

from harmonyrl.envs.base import EnvFactory
from harmonyrl.harmony.tokenizer import Codec
from harmonyrl.rollout.agent_loop import first_prompt
from harmonyrl.rollout.env_calls import EnvFault, env_call, env_call_sync
from harmonyrl.types import Task

PER_SPLIT = 32
"""Tasks checked from the start of each split (the held-out evaluation uses the first tasks of its split)."""


async def prompt_lengths(factory: EnvFactory, codec: Codec, tasks: Sequence[Task]) -> list[int]:
    """Token length of each task's first prompt, rendered by the agent loop's own :func:`first_prompt`.

    A task whose env fails to make, reset or close (an ``EnvFault``) is left out: in a rollout that is a masked
    ``env_error`` of one episode, and this advisory check must not turn it into a run that cannot start. Any
    other exception (rendering the prompt) is the harness's and propagates."""
    lengths = []
    for task in tasks:
        try:
            env = env_call_sync("make", factory.make, task)
            try:
                _, ids = await first_prompt(env, codec)
            finally:
                await env_call("close", env.close)
        except EnvFault:
            continue
        lengths.append(len(ids))
    return lengths


@dataclass(frozen=True)
class PromptFit:
    """Prompt ``lengths`` against an episode budget of ``max_seq_len`` tokens and turns of ``max_new_tokens``."""

    lengths: tuple[int, ...]
    max_seq_len: int
    max_new_tokens: int

    @property
    def no_room(self) -> int:
        """Prompts with no token left to generate."""
        return sum(n >= self.max_seq_len for n in self.lengths)

    @property
    def short_room(self) -> int:
        """Prompts leaving some room, but less than one turn's ``max_new_tokens``."""
        return sum(0 < self.max_seq_len - n < self.max_new_tokens for n in self.lengths)

    def warning(self) -> str | None:
        """One line for the user, or None when every checked prompt leaves a full turn of room."""
        short, none = self.short_room, self.no_room
        if not short and not none:
            return None
        longest = max(self.lengths)
        suggest = -(-(longest + 4 * self.max_new_tokens) // 256) * 256  # room for a few turns, rounded up
        return (
            f"{short + none} of {len(self.lengths)} checked prompts (longest {longest} tokens) leave less than "
            f"max_new_tokens={self.max_new_tokens} of rollout.max_seq_len={self.max_seq_len}"
            f"{f' ({none} leave none)' if none else ''}: those episodes end truncated whatever the model does; "
            f"try rollout.max_seq_len={suggest}"
        )


async def warn_if_prompts_do_not_fit(
    factory: EnvFactory, codec: Codec, max_seq_len: int, max_new_tokens: int, console: Console
) -> None:
    """Print :meth:`PromptFit.warning` (in yellow) for the first :data:`PER_SPLIT` train and held-out tasks."""
    tasks = [*factory.tasks("train")[:PER_SPLIT], *factory.tasks("test")[:PER_SPLIT]]
    fit = PromptFit(tuple(await prompt_lengths(factory, codec, tasks)), max_seq_len, max_new_tokens)
    warning = fit.warning()
    if warning:
        console.print(f"[yellow]warning:[/] env {factory.name}: {warning}")
