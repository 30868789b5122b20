"""The ``scale`` and ``env_faults`` sections: where a run's environments live (this process or Ray actors), and
the faults injected into them on purpose."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from harmonyrl.frozen import Frozen


class FaultInjectionConfig(Frozen):
    """Make a fraction of RL tool calls fail on purpose (:mod:`harmonyrl.envs.faults`): a training run must lose no
    step and mask exactly the faulted episodes (``env/injected_*`` vs ``env/failure_*``). Off by default."""

    rate: float = Field(0.0, ge=0, le=1)
    """Fraction of tool calls (train-split episodes only) that fail."""
    kinds: tuple[Literal["tool_timeout", "tool_crash", "sandbox_error", "env_error", "hang"], ...] = Field(
        ("tool_timeout", "tool_crash"), min_length=1
    )
    """How they fail; ``hang`` never answers, so the episode budget (``rollout.episode_timeout_s``) must end it."""
    seed: int = 0
    timeout_delay_s: float = Field(0.0, ge=0)
    """Wall clock an injected ``tool_timeout`` takes before it is reported."""


class ScaleConfig(Frozen):
    """Where a run's environments live: in this process (the default), or in a pool of Ray actors (docs/ray.md)."""

    ray: bool = False
    """Run the environments in Ray actors (env workers) instead of this process (``pip install 'harmonyrl[ray]'``)."""
    address: str | None = None
    """Ray cluster to join: ``HOST:PORT`` of its head, ``ray://HOST:PORT`` (Ray client) or ``auto``; null starts a
    local cluster for the run."""
    env_workers: int = Field(2, ge=1)
    """Env worker actors; each holds the envs of the episodes assigned to it (the least loaded worker first)."""
    worker_cpus: float = Field(1.0, gt=0)
    """Logical CPUs each worker reserves (one placement-group bundle per worker; fractions allowed)."""
    worker_concurrency: int = Field(1, ge=1)
    """Env calls one worker runs at a time (1: one; raise it for tools that wait on I/O rather than compute)."""
    placement: Literal["spread", "pack"] = "spread"
    """Placement-group strategy of the workers' bundles: spread over the nodes, or pack onto as few as fit."""
    max_restarts: int = Field(3, ge=-1)
    """Times Ray restarts a worker that died (-1: always). Its episodes in flight are masked env faults either way."""
    start_timeout_s: float = Field(60.0, gt=0, le=3600)
    """Bound on each start-up stage (reaching the cluster, placing the workers, their building the env): past it,
    a one-line error."""

    @field_validator("address")
    @classmethod
    def _is_address(cls, address: str | None) -> str | None:
        if address is None or address == "auto":
            return address
        host, sep, port = address.removeprefix("ray://").rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"'{address}' is not HOST:PORT, ray://HOST:PORT or auto")
        return address
