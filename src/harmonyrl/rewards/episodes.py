"""What a reward model or judge reads of a finished episode: the task's prompt and the answer the policy gave."""

from __future__ import annotations

from harmonyrl.types import Message, Trajectory


def episode_answer(traj: Trajectory) -> str:
    """The content of the episode's last ``final`` message; without one (a truncated or malformed episode) the last
    sampled message's content, else the empty string. Analysis and tool calls are not part of the answer."""
    sampled = [m for turn in traj.turns for m in turn.sampled]
    finals = [m for m in sampled if m.channel == "final" and m.recipient is None]
    if finals:
        return finals[-1].content
    return sampled[-1].content if sampled else ""


CHECKED_TERM = "constraints_met"


def checked_score(traj: Trajectory) -> float:
    """What the env's code checkers say of an episode, as finely as they say it: ``constraints_met`` (instruct: the
    fraction of its constraints that hold) when the env logs it, else the episode's env reward."""
    return traj.reward_terms.get(CHECKED_TERM, traj.reward)


def prompt_messages(prompt: str) -> tuple[Message, ...]:
    """A task prompt as the reward model reads it: one user message (as a plain-text preference pair)."""
    return (Message(role="user", content=prompt),)


def answer_messages(answer: str) -> tuple[Message, ...]:
    """An answer as the reward model reads it: one ``final`` assistant message."""
    return (Message(role="assistant", channel="final", content=answer),)
