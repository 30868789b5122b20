"""The SFT warm start of a team env: every role's scripted expert demonstrates its part of each task.

A team episode is demonstrated as rollouts play it (:mod:`harmonyrl.rollout.team`): the first role's expert on
the task, then each later role's expert on the task as that role sees it — its ``prompt`` replaced by the previous
role's demonstrated handoff (its final message). Each role's demonstration is one demo with its own prompt and
loss mask, rendered like a single agent's (:func:`~harmonyrl.sft.train.render_demo`), so SFT trains one shared
policy on every role, the role being in the developer instructions. The seats of a game
(:class:`~harmonyrl.envs.team.SeatedTeam`) hand nothing over: each seat's expert plays the task itself, alone
against its scripted opponent, as ``role_factory(seat)`` sets it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

from harmonyrl.envs.team import SeatedTeam, TeamFactory
from harmonyrl.harmony.tokenizer import Codec
from harmonyrl.rollout.agent_loop import initial_messages
from harmonyrl.sft.train import Demo, render_demo
from harmonyrl.types import Message, Task


def demo_handoff(demo: Sequence[Message]) -> str:
    """The demonstrated handoff: the text of the demo's last final-channel message ("" if none)."""
    finals = [m.content for m in demo if m.role == "assistant" and m.channel == "final" and not m.is_tool_call]
    return finals[-1] if finals else ""


async def build_team_demos(codec: Codec, team: TeamFactory, tasks: Sequence[Task], seed: int) -> list[Demo]:
    """``len(roles)`` demonstrations per task, role by role (one seeded stream over the tasks in order, so the same
    arguments give the same demos)."""
    rng = random.Random(seed)
    demos = []
    for task in tasks:
        seen = task
        for role in range(len(team.roles)):
            env = team.role_factory(role).make(seen)
            prefix = initial_messages(env, await env.reset())
            await env.close()
            demo = team.role_expert(role)(seen, rng)
            demos.append(render_demo(codec, prefix, demo))
            seen = task if isinstance(team, SeatedTeam) else replace(task, prompt=demo_handoff(demo))
    return demos
