"""One episode as one asyncio task: generate → parse → act → observe, token in / token out.

The trajectory's ``token_ids`` are assembled from (a) the rendered prompt, (b) the ids the engine sampled,
kept exactly as sampled, and (c) the rendered tool observations. Sampled text is never re-tokenised; a
parity check re-renders each parsed turn and counts any turn whose canonical rendering differs from the
sampled ids (invariant 1) — the counter is a metric, the sampled ids are what the trainer scores.

The environment's own calls (reset with the tools it declares, step) go through
:mod:`harmonyrl.rollout.env_calls`, so an exception there is an ``EnvFault``; an exception anywhere else (engine,
parser, renderer) propagates unchanged: it is the harness's, and must not be masked as the environment's.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from harmonyrl.engine.base import Engine
from harmonyrl.engine.turn import EPISODE_TURN
from harmonyrl.envs.base import Env
from harmonyrl.harmony.parse import parse_completion
from harmonyrl.harmony.render import (
    developer_message,
    render_completion,
    render_message,
    render_prompt,
    system_message,
)
from harmonyrl.harmony.tokenizer import Codec
from harmonyrl.models.moe_routing import NOT_ROUTED
from harmonyrl.rollout.env_calls import env_call, env_call_sync
from harmonyrl.types import Failure, Message, Routing, SamplingParams, StepResult, Trajectory, Turn


@dataclass(frozen=True)
class EpisodeLimits:
    """What bounds one episode. Turns and tokens truncate it (the model's doing, deterministic);
    ``timeout_s`` is its wall-clock budget, enforced by the scheduler (see :mod:`harmonyrl.rollout.scheduler`):
    an expiry cancels the running tool or sandbox and ends the episode as an ``episode_timeout`` fault."""

    max_turns: int
    max_new_tokens: int
    max_seq_len: int
    timeout_s: float | None = None


def turn_seed(base_seed: int, turn: int) -> int:
    """A per-turn sampling seed that does not depend on scheduling order."""
    digest = hashlib.blake2b(f"{base_seed}:{turn}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF


def initial_messages(env: Env, first: Sequence[Message]) -> list[Message]:
    """System + developer (instructions and tool declarations) + the env's first messages.

    The system message omits the ChatGPT identity and knowledge cutoff lines: they cost a tiny model
    ~26 prompt tokens per episode and say nothing true about it. Reading ``env.tools`` runs the env's code,
    so a failure there is an environment fault (``EnvFault``).
    """
    tools, instructions = env_call_sync("tools", lambda: (list(env.tools), env.instructions))
    system = system_message(model_identity=None, knowledge_cutoff=None, function_tools=bool(tools))
    return [system, developer_message(instructions, tools), *first]


async def first_prompt(env: Env, codec: Codec) -> tuple[list[Message], list[int]]:
    """Reset ``env``; return the episode's opening messages and their prompt ids (up to the assistant's turn)."""
    messages = initial_messages(env, await env_call("reset", env.reset))
    return messages, render_prompt(codec, messages, next_role="assistant")


class _Builder:
    """Accumulates the token stream with its loss mask and sampler log-probs (all the same length)."""

    def __init__(self, prompt_ids: list[int]) -> None:
        self.ids = list(prompt_ids)
        self.mask = [0] * len(prompt_ids)
        self.logprobs = [0.0] * len(prompt_ids)
        self.versions = [-1] * len(prompt_ids)
        """The policy version that sampled each token (-1: not sampled), kept when turns span versions."""
        self.routing: list[torch.Tensor] | None = []
        """Engine routing ``[n, L, k]`` chunks covering positions ``0 ..`` in order; None once a generation
        came without routing (then the trajectory carries none)."""

    def add_routing(self, routing: Routing | None) -> None:
        """Keep the routing of positions no earlier generation covered (first writer wins: a sampled
        position keeps the routing of the decode step that sampled from it, not the next turn's prefill)."""
        if routing is None or self.routing is None:
            self.routing = None
            return
        have = sum(chunk.shape[0] for chunk in self.routing)
        if routing.ids.shape[0] > have:
            self.routing.append(routing.ids[have:])

    def full_routing(self) -> Routing | None:
        """``[len(ids), L, k]``: positions no generation ran (the final token) are ``-1``."""
        if not self.routing:
            return None
        ids = torch.cat(self.routing)
        tail = ids.new_full((len(self.ids) - ids.shape[0], *ids.shape[1:]), NOT_ROUTED)
        return Routing(torch.cat([ids, tail]))

    def add_sampled(self, ids: Sequence[int], logprobs: Sequence[float], version: int = 0) -> None:
        self.ids.extend(ids)
        self.mask.extend([1] * len(ids))
        self.logprobs.extend(logprobs)
        self.versions.extend([version] * len(ids))

    def token_versions(self) -> tuple[int, ...]:
        """Per-token versions when more than one version sampled the episode (partial rollouts); else empty."""
        return tuple(self.versions) if len({v for v in self.versions if v >= 0}) > 1 else ()

    def add_context(self, ids: Sequence[int]) -> None:
        self.ids.extend(ids)
        self.mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))
        self.versions.extend([-1] * len(ids))


def observation_ids(codec: Codec, observations: Sequence[Message]) -> list[int]:
    """Rendered observations followed by the header that hands the turn back to the assistant."""
    ids: list[int] = []
    for msg in observations:
        ids.extend(render_message(codec, msg))
    ids.extend(render_prompt(codec, [], next_role="assistant"))
    return ids


async def run_episode(
    engine: Engine,
    env: Env,
    codec: Codec,
    params: SamplingParams,
    limits: EpisodeLimits,
    *,
    task_id: str,
    group_id: int,
    seed: int,
    transcript: list[Turn] | None = None,
) -> Trajectory:
    """Run one episode to termination, truncation or an environment failure.

    ``transcript``, if given, receives the turns as they happen (a turn whose tool call is still running is
    there with no observations yet), so a caller that cancels the episode or sees it raise still has what
    the model did up to that point for the episode record."""
    messages, prompt_ids = await first_prompt(env, codec)
    stream = _Builder(prompt_ids)
    turns: list[Turn] = [] if transcript is None else transcript
    reward, terminated, truncated = 0.0, False, False
    failure: Failure | None = None
    terms: dict[str, float] = {}
    mismatches = 0
    version: int | None = None  # the oldest weight version that sampled a token of this episode
    for turn in range(limits.max_turns):
        budget = min(limits.max_new_tokens, limits.max_seq_len - len(stream.ids))
        if budget <= 0:
            truncated = True
            break
        t0 = time.perf_counter()
        EPISODE_TURN.set(turn)  # an engine that picks its weights by turn reads it (rl.async.partial)
        gen = await engine.generate(stream.ids, replace(params, max_new_tokens=budget, seed=turn_seed(seed, turn)))
        gen_s = time.perf_counter() - t0
        version = gen.policy_version if version is None else min(version, gen.policy_version)
        stream.add_sampled(gen.token_ids, gen.logprobs, gen.policy_version)
        stream.add_routing(gen.routing)
        parsed = parse_completion(codec, gen.token_ids)
        if parsed.error is None and render_completion(codec, parsed.messages) != list(gen.token_ids):
            mismatches += 1
        if gen.finish_reason == "length" or parsed.error is not None:
            # Out of budget mid-message is truncation; a malformed message is the model's fault (reward 0).
            truncated = gen.finish_reason == "length"
            terminated = not truncated
            terms["parse_error"] = 0.0 if truncated else 1.0
            err = None if parsed.error is None else f"{parsed.error.kind}: {parsed.error.detail}"
            turns.append(Turn(parsed.messages, err, (), gen_s, 0.0))
            break
        turns.append(Turn(parsed.messages, None, (), gen_s, 0.0))  # in the transcript while the tool runs
        t1 = time.perf_counter()
        result: StepResult = await env_call("step", env.step, parsed.messages)
        tool_s = time.perf_counter() - t1
        turns[-1] = Turn(parsed.messages, None, result.observations, gen_s, tool_s)
        messages.extend(parsed.messages)
        reward += result.reward
        terms.update(result.info)
        if result.failure is not None:
            failure = result.failure
            break
        if result.terminated or result.truncated:
            terminated, truncated = result.terminated, result.truncated
            break
        messages.extend(result.observations)
        stream.add_context(observation_ids(codec, result.observations))
    else:
        truncated = True
    return Trajectory(
        task_id=task_id,
        group_id=group_id,
        token_ids=tuple(stream.ids),
        loss_mask=tuple(stream.mask),
        sampler_logprobs=tuple(stream.logprobs),
        reward=reward,
        terminated=terminated,
        truncated=truncated and not terminated,
        failure=failure,
        turns=tuple(turns),
        parity_mismatches=mismatches,
        reward_terms=terms,
        routing=stream.full_routing(),
        policy_version=version or 0,
        token_versions=stream.token_versions(),
    )
