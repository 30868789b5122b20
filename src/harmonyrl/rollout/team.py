"""Team episodes: several agents with roles play one episode in turn, each with its own trajectory.

A team factory (:class:`~harmonyrl.envs.team.TeamFactory`) gives one ordinary env factory per role. The roles run
one after the other, **stage by stage over the whole batch**: every request's first role runs through
:func:`~harmonyrl.rollout.scheduler.run_episodes` (concurrency, wall-clock budgets, fault masking and group
retries unchanged), then every request's second role, whose task is the original task with its ``prompt``
replaced by the previous role's handoff — so a later role never sees the question unless a teammate wrote it.

**Handoff.** A role's handoff is its last final-channel message (empty if it wrote none, e.g. truncated).

**Rewards and credit.** The team's reward is the last role's (its env grades the task); every role's trajectory
gets that reward and the last role's reward terms, plus ``team_role`` (the role's index, how per-role metrics find
it). All roles of a request keep the request's ``group_id``, so the group-relative update compares the team's
episodes of one task (docs/multiagent.md derives that this is each role's own group-relative advantage, up to a
factor fixed by the group size). Each trajectory keeps its own tokens and loss mask: the trainer trains on them
as on any episode.

**Faults.** If any role's episode is an environment fault, every role of that request is masked with it (a team
outcome that was never graded is nobody's reward of 0), and the later roles are not run.

Seeds: role ``i`` of a request samples with :func:`~harmonyrl.rollout.role_seeds.role_seed` (role 0 with the
request's own seed).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from harmonyrl.engine.base import Engine
from harmonyrl.envs.base import EnvFactory
from harmonyrl.envs.team import SeatedTeam, SeatTagged, TeamFactory
from harmonyrl.harmony.tokenizer import Codec
from harmonyrl.rollout.agent_loop import EpisodeLimits
from harmonyrl.rollout.role_seeds import role_seed
from harmonyrl.rollout.scheduler import EpisodeRequest, RolloutResult, run_episodes, with_task
from harmonyrl.rollout.seats import run_seated_episodes
from harmonyrl.telemetry.metrics import summarize_rollouts
from harmonyrl.types import ROLE_TERM, Failure, SamplingParams, Trajectory


def handoff(trajectory: Trajectory) -> str:
    """What a role hands the next one: its last final-channel message's text ("" if it wrote none)."""
    for turn in reversed(trajectory.turns):
        for msg in reversed(turn.sampled):
            if msg.role == "assistant" and msg.channel == "final" and not msg.is_tool_call:
                return msg.content
    return ""


def _failed_later(req: EpisodeRequest, failure: Failure) -> Trajectory:
    """The stand-in for a role that never ran because an earlier role's episode failed."""
    detail = f"an earlier role's episode failed ({failure.kind}: {failure.detail})"
    failed = Trajectory(req.task.id, req.group_id, (), (), (), 0.0, False, False, Failure(failure.kind, detail), ())
    return with_task(failed, req.task)


def assign_team_reward(stages: Sequence[Sequence[Trajectory]]) -> list[tuple[Trajectory, ...]]:
    """Per request, its roles' trajectories with the team's outcome: ``stages[i][j]`` is role ``i`` of request
    ``j``. Every role gets the last role's reward and terms (plus ``team_role``); a failure masks every role."""
    out = []
    for roles in zip(*stages, strict=True):
        failure = next((t.failure for t in roles if t.failure is not None), None)
        last = roles[-1]
        team = []
        for i, t in enumerate(roles):
            terms = {**last.reward_terms, ROLE_TERM: float(i)}
            if failure is None:
                team.append(replace(t, reward=last.reward, reward_terms=terms))
            else:  # masked with its own or a teammate's failure: kept for the record, never trained on
                team.append(replace(t, reward=0.0, reward_terms=terms, failure=t.failure or failure))
        out.append(tuple(team))
    return out


async def run_team_episodes(
    engine: Engine,
    team: TeamFactory,
    codec: Codec,
    requests: Sequence[EpisodeRequest],
    params: SamplingParams,
    limits: EpisodeLimits,
    max_concurrency: int,
    retry_faulted_groups: int = 0,
) -> RolloutResult:
    """Run every request's team episode (see the module docstring); the trajectories come request by request,
    each request's roles in order."""
    stages: list[list[Trajectory]] = []
    wall, group_retries, retried = 0.0, 0, 0
    for role in range(len(team.roles)):
        previous = stages[-1] if stages else None
        todo, slots = [], []
        for j, req in enumerate(requests):
            if previous is not None and previous[j].failure is not None:
                continue
            task = req.task if previous is None else replace(req.task, prompt=handoff(previous[j]))
            todo.append(EpisodeRequest(task, req.group_id, role_seed(req.seed, role)))
            slots.append(j)
        ran = await run_episodes(engine, team.role_factory(role), codec, todo, params, limits, max_concurrency,
                                 retry_faulted_groups)  # fmt: skip
        wall += ran.wall_s
        group_retries += ran.group_retries
        retried += ran.retried_episodes
        stage: list[Trajectory] = []
        by_slot = dict(zip(slots, ran.trajectories, strict=True))
        for j, req in enumerate(requests):
            failed = previous[j].failure if previous is not None else None
            stage.append(_failed_later(req, failed) if failed is not None else by_slot[j])  # not run: it failed
        stages.append(stage)
    trajectories = tuple(t for roles in assign_team_reward(stages) for t in roles)
    return RolloutResult(trajectories, wall, group_retries, retried)


async def run_rollouts(
    engine: Engine,
    factory: EnvFactory,
    codec: Codec,
    requests: Sequence[EpisodeRequest],
    params: SamplingParams,
    limits: EpisodeLimits,
    max_concurrency: int,
    retry_faulted_groups: int = 0,
) -> RolloutResult:
    """:func:`~harmonyrl.rollout.scheduler.run_episodes`, :func:`run_team_episodes` for a team factory, or
    :func:`~harmonyrl.rollout.seats.run_seated_episodes` for a seated one (a game's seats, played at once)."""
    if isinstance(factory, SeatedTeam):
        return await run_seated_episodes(engine, factory, codec, requests, params, limits, max_concurrency,
                                         retry_faulted_groups)  # fmt: skip
    if isinstance(factory, TeamFactory):
        return await run_team_episodes(engine, factory, codec, requests, params, limits, max_concurrency,
                                       retry_faulted_groups)  # fmt: skip
    return await run_episodes(engine, factory, codec, requests, params, limits, max_concurrency, retry_faulted_groups)


def one_per_episode(trajectories: Sequence[Trajectory]) -> list[Trajectory]:
    """One trajectory per (team) episode: a team's first role (it carries the team's outcome), every single-agent
    trajectory as it is — for counts over episodes, such as pass@k, that must not see a team episode twice."""
    return [t for t in trajectories if t.reward_terms.get(ROLE_TERM, 0.0) == 0.0]


def role_metrics(factory: EnvFactory, trajectories: Sequence[Trajectory], prefix: str = "team") -> dict[str, float]:
    """Per-role metrics ``{prefix}/{role}/…`` (reward, success, response tokens, parse-error rate, tool-call
    rate, …: :func:`~harmonyrl.telemetry.metrics.summarize_rollouts` over that role's episodes, plus the mean of
    each of the factory's ``role_terms`` over them, e.g. a seat's ``win``/``draw``/``loss`` rates); empty for a
    single-agent factory that names no seats (:class:`~harmonyrl.envs.team.SeatTagged`)."""
    role_of: Callable[[Trajectory], float | None]
    if isinstance(factory, TeamFactory):
        role_of = lambda t: t.reward_terms.get(ROLE_TERM)  # noqa: E731
    elif isinstance(factory, SeatTagged):
        tagged = factory
        role_of = lambda t: None if (seat := tagged.role_of(t.task_id)) is None else float(seat)  # noqa: E731
    else:
        return {}
    terms: tuple[str, ...] = getattr(factory, "role_terms", ())
    out: dict[str, float] = {}
    roles: tuple[str, ...] = factory.roles
    for i, role in enumerate(roles):
        mine = [t for t in trajectories if role_of(t) == i]
        summary = summarize_rollouts(mine, f"{prefix}/{role}")  # the env's terms: the role_terms below, once
        out |= {k: v for k, v in summary.items() if not k.startswith("env/") and "/terms/" not in k}
        ok = [t for t in mine if t.failure is None]
        for term in terms:
            have = [t.reward_terms[term] for t in ok if term in t.reward_terms]
            if have:
                out[f"{prefix}/{role}/{term}"] = sum(have) / len(have)
    return out
