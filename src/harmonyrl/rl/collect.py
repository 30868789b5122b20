"""How one RL step's episodes are drawn and run: the step's tasks from the task source, its groups on the engine
(a team env's roles in turn), the learned or judged reward terms on top. The pipeline calls it per step."""

from __future__ import annotations

from collections.abc import Sequence

from harmonyrl.config import RunConfig
from harmonyrl.engine.base import Engine
from harmonyrl.envs.base import EnvFactory
from harmonyrl.harmony.codecs import RunCodec
from harmonyrl.rl.pipeline import Collect, Drawn, StepDraws
from harmonyrl.rl.reward_setup import RunRewarder
from harmonyrl.rollout.agent_loop import EpisodeLimits
from harmonyrl.rollout.sampling import sample_step
from harmonyrl.rollout.scheduler import EpisodeRequest, RolloutResult
from harmonyrl.rollout.task_stream import TaskSource
from harmonyrl.rollout.team import run_rollouts
from harmonyrl.run.setup import with_faults
from harmonyrl.types import SamplingParams


def rollout_params(config: RunConfig, tok: RunCodec) -> SamplingParams:
    """The RL rollouts' decoding: the configured temperature and truncation, stopping at a tool call or a return."""
    r = config.rollout
    return SamplingParams(
        temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, stop_ids=(tok.special.call, tok.special.return_)
    )


def make_collect(
    config: RunConfig,
    engine: Engine,
    factory: EnvFactory,
    tok: RunCodec,
    limits: EpisodeLimits,
    source: TaskSource,
    rewarder: RunRewarder | None,
) -> Collect:
    """``collect(step, on)``: step ``step``'s episodes on engine copy ``on`` (``engine`` or one of the pipeline's
    replicas of it), with the weights it holds now. The seed is a function of the run's
    seed and the step alone, so a step's batch never depends on when it is collected."""
    r = config.rollout
    params = rollout_params(config, tok)

    async def collect(step: int, on: Engine) -> Drawn:
        step_factory = with_faults(factory, config.env_faults, step)  # ``factory`` itself unless faults are on

        async def run(requests: Sequence[EpisodeRequest]) -> RolloutResult:
            result = await run_rollouts(on, step_factory, tok, requests, params, limits, r.engine.concurrency,
                                        r.retry_faulted_groups)  # fmt: skip  # a team env: its roles in turn
            return result if rewarder is None else await rewarder.rescore(result)  # learned / judged terms

        seed = config.seed * 100_003 + step
        draws = StepDraws(source)  # the source's position after this step's draws, not a later batch's
        sampled = await sample_step(run, draws, step, r.tasks_per_step, r.group_size, seed, config.rl.sampling)
        return Drawn(sampled, step_factory, draws.after)

    return collect
