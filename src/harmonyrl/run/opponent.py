"""A checkpoint as a two-player game's fixed opponent (``env.opponent=<folder>``, docs/textarena.md).

The env layer cannot load a model, so the run builds the opponent's player and hands it to the env factory
(:func:`harmonyrl.run.setup.env_factory`): the checkpoint on an embedded engine of its own
(:func:`harmonyrl.run.setup.opponent_player`) driven by the run's agent loop, so the opponent's seat is rendered,
sampled and parsed exactly as a policy seat is, within the run's episode limits, and a checkpoint trained on the game
plays as it learned to. Its trajectories are thrown away: it is never trained.
"""

from __future__ import annotations

from dataclasses import dataclass

from harmonyrl.engine.base import Engine
from harmonyrl.envs.base import Env
from harmonyrl.harmony.tokenizer import Codec
from harmonyrl.rollout.agent_loop import EpisodeLimits, run_episode
from harmonyrl.types import SamplingParams


@dataclass(frozen=True)
class CheckpointPlayer:
    """Plays one seat's episode with ``engine`` at ``temperature`` (a :data:`~harmonyrl.tasks.ecosystems.
    textarena_seats.SeatPlayer`); the caller closes the env."""

    engine: Engine
    codec: Codec
    temperature: float
    limits: EpisodeLimits

    async def __call__(self, env: Env, seed: int) -> None:
        stops = (self.codec.special.call, self.codec.special.return_)
        params = SamplingParams(temperature=self.temperature, stop_ids=stops)
        await run_episode(self.engine, env, self.codec, params, self.limits, task_id="opponent", group_id=-1, seed=seed)
