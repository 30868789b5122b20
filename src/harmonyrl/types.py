"""Core value types shared by every layer: messages, tool calls, engine I/O, trajectories.

All types are frozen dataclasses. Token-level fields are plain Python lists/tuples (cheap to build in
the async agent loop); tensors appear only once a :class:`Batch` is assembled for the trainer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, TypeGuard, get_args

import torch

Role = Literal["system", "developer", "user", "assistant", "tool"]
Channel = Literal["analysis", "commentary", "final"]
CHANNELS: tuple[Channel, ...] = ("analysis", "commentary", "final")


@dataclass(frozen=True)
class Message:
    """One harmony message.

    ``name`` is the author name for tool messages (``"functions.calculator"``); ``recipient`` is where an
    assistant message is addressed (``"functions.calculator"`` for a tool call) or, for a tool result,
    ``"assistant"``. ``content_type`` is the ``<|constrain|>`` value (``"json"``) of a tool call.
    System and developer messages carry their fully formatted text in ``content``
    (see :mod:`harmonyrl.harmony.render` for the builders).
    """

    role: Role
    content: str
    channel: Channel | None = None
    recipient: str | None = None
    name: str | None = None
    content_type: str | None = None

    @property
    def is_tool_call(self) -> bool:
        return self.role == "assistant" and self.recipient is not None and self.recipient != "assistant"

    @property
    def tool_name(self) -> str | None:
        """``"calculator"`` for a call addressed to ``functions.calculator``; None if not a tool call."""
        if not self.is_tool_call or self.recipient is None:
            return None
        return self.recipient.split(".", 1)[1] if "." in self.recipient else self.recipient


@dataclass(frozen=True)
class ToolSpec:
    """A tool declaration as the model sees it: name, one-line description, JSON schema of the arguments."""

    name: str
    description: str
    parameters: dict[str, object]


FailureKind = Literal["tool_timeout", "tool_crash", "sandbox_error", "env_error", "episode_timeout", "reward_error"]
# reward_error: a reward term could not score the episode (an LLM judge's reply without a score, rewards/judge.py)
ENV_FAILURE_KINDS: frozenset[str] = frozenset(get_args(FailureKind))
"""Environment faults. These are never the model's fault: the episode is masked out of the loss."""


def is_env_failure_kind(value: object) -> TypeGuard[FailureKind]:
    """Whether ``value`` names an environment fault kind (e.g. an exception's own ``failure_kind``)."""
    return value in ENV_FAILURE_KINDS


ModelFaultKind = Literal["parse_error", "invalid_tool_args", "unknown_tool", "tool_error"]
"""Model faults: shown to the model as observations / scored by the env, never masked. ``tool_error``: a tool
raised while handling the model's arguments (the rule is in :mod:`harmonyrl.envs.tools`)."""


@dataclass(frozen=True)
class Failure:
    kind: FailureKind
    detail: str


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 disables top-k
    max_new_tokens: int = 128
    stop_ids: tuple[int, ...] = ()
    seed: int = 0
    """Per-request seed. Sampling noise is a function of (seed, position) only, so a request samples the same
    tokens whatever else is in the batch."""


@dataclass(frozen=True, eq=False, repr=False)
class Routing:
    """MoE routing of a token stream: ``ids`` ``[T, L, k]`` — the top-k expert ids at each position, per layer.

    The one tensor among these types: ``T·L·k`` small ints are too many for a tuple. int8 (int16 beyond 127
    experts, see :func:`harmonyrl.models.moe_routing.routing_dtype`); ``-1`` marks a token-layer whose routing
    was never computed (the trainer then routes it itself). Equality compares values and dtype.
    """

    ids: torch.Tensor

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Routing)
            and self.ids.dtype == other.ids.dtype
            and self.ids.shape == other.ids.shape
            and bool(torch.equal(self.ids, other.ids))
        )

    __hash__ = None  # type: ignore[assignment]  # mutable tensor inside: not hashable

    def __repr__(self) -> str:
        """Shape and dtype, never the values: formatting ``T·L·k`` ints reads each one back (a device sync each on
        CUDA), and Python formats results it is never asked to show — ``asyncio.run`` repr()s its finished task,
        result included, when it restores the SIGINT handler (3.11 and 3.12: ``signal.getsignal`` → enum), which
        made a timed ``asyncio.run`` of 4 generations 10 ms (70 %) slower on the CPU."""
        return f"Routing(ids=<{'x'.join(map(str, self.ids.shape))} {str(self.ids.dtype).removeprefix('torch.')}>)"


@dataclass(frozen=True)
class Generation:
    """What the engine returns for one request.

    ``token_ids`` includes the stop token when ``finish_reason == "stop"``. ``logprobs[i]`` is the
    sampler's log-probability of ``token_ids[i]`` under the *unmodified* distribution at temperature 1
    (i.e. ``log_softmax(logits)``), so it is comparable with the trainer's log-probs.
    """

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: Literal["stop", "length"]
    routing: Routing | None = None
    """Experts the engine chose at every position it ran, ``len(prompt) + len(token_ids) - 1`` rows (the
    last sampled token is never fed back); None if the engine does not record routing."""
    policy_version: int = 0
    """Which weight sync the sampling weights came from (0: the engine's starting weights; the trainer's RL step
    after each sync)."""


Split = Literal["train", "validation", "test"]
"""The three task splits of every env, disjoint by the env's canonical key: ``train`` is trained on, ``validation``
is where settings are chosen (sweeps, presets), ``test`` is where the chosen settings are reported, once."""


@dataclass(frozen=True)
class Task:
    """One problem instance. ``answer`` is the expected answer: what the env's verifier checks against, shown to
    people beside each recorded episode (``harmonyrl show``, the report, ``rollouts/episodes.jsonl``) and never to
    the model; ``""`` for an env that has none (a judged or open-ended task)."""

    id: str
    prompt: str
    answer: str
    split: Split


@dataclass(frozen=True)
class StepResult:
    """What ``Env.step`` returns. ``observations`` are appended to the conversation (tool results)."""

    observations: tuple[Message, ...] = ()
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    failure: Failure | None = None
    info: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Turn:
    """One generate → act cycle inside an episode (for metrics and the readable episode view)."""

    sampled: tuple[Message, ...]
    parse_error: str | None
    observations: tuple[Message, ...]
    generation_s: float
    tool_s: float


ROLE_TERM = "team_role"
"""The reward term holding a team trajectory's role index (set by the team rollout; absent for one agent)."""


@dataclass(frozen=True)
class Trajectory:
    """A finished episode, token in / token out.

    Shapes (all length ``T`` = number of tokens in the conversation):
      * ``token_ids`` — the exact ids the model saw/produced; sampled ids are never re-tokenised.
      * ``loss_mask`` — 1 only where the policy sampled the token; prompt and tool-output tokens are 0.
      * ``sampler_logprobs`` — engine log-prob at sampled positions, 0.0 elsewhere.
    ``reward`` is the episode return; ``failure`` is set only for environment faults.
    """

    task_id: str
    group_id: int
    token_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    sampler_logprobs: tuple[float, ...]
    reward: float
    terminated: bool
    truncated: bool
    failure: Failure | None
    turns: tuple[Turn, ...]
    parity_mismatches: int = 0
    reward_terms: dict[str, float] = field(default_factory=dict)
    routing: Routing | None = None
    """The sampler's expert choice per position ``[T, L, k]`` (R3 routing replay), or None if not recorded.
    Each position keeps the routing of the engine call that first ran it: the call that sampled the next
    token for sampled positions, the next turn's prefill for tool output."""
    policy_version: int = 0
    """The engine's weight version that sampled the tokens (``Generation.policy_version``; the oldest if an episode
    spanned a weight sync); its staleness when trained is the trainer's version minus this (docs/async.md)."""
    task_prompt: str = ""
    """The task's prompt (``Task.prompt``): with ``expected_answer``, what a person debugging the episode reads
    beside it; stamped by the scheduler, not part of what the model saw beyond the rendered conversation."""
    expected_answer: str = ""
    """The task's expected answer (``Task.answer``; ``""`` where it has none). For people only: never shown to the
    model."""
    token_versions: tuple[int, ...] = ()
    """The policy version that sampled each token (length ``T``; ``-1`` where the policy did not sample: prompt
    and tool output), recorded only when an episode's turns were sampled by more than one version (partial
    rollouts, ``rl.async.partial``, docs/async.md); empty when one version sampled them all, ``policy_version``.
    :meth:`versions` reads both forms."""

    @property
    def num_sampled(self) -> int:
        return sum(self.loss_mask)

    def versions(self) -> tuple[int, ...]:
        """The version that sampled each token, ``-1`` where none did (``token_versions``, or ``policy_version``
        at every sampled position when one version sampled the whole episode)."""
        if self.token_versions:
            return self.token_versions
        return tuple(self.policy_version if m else -1 for m in self.loss_mask)

    @property
    def success(self) -> bool:
        return self.reward_terms.get("correct", 0.0) > 0.5
