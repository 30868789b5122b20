"""What the embedded engine did with its time: counters that benchmarks and the trainer's ``engine/*`` metrics
read over a window (:meth:`EngineStats.since`).

The worker's time splits three ways: *busy* (whole steps, bookkeeping included; *compute* is the model and
sampler's part of it, *prefill* part of that), *idle* (nothing queued or running), and the rest, when the event
loop runs the agents' own code between steps while requests may be waiting.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace


@dataclass
class EngineStats:
    """Counters for benchmarks: utilisation = ``busy_seconds / wall`` over the caller's window."""

    tokens_generated: int = 0
    busy_seconds: float = 0.0
    """The engine's own time: whole steps, from admitting requests through the model and sampling to resolving
    finished requests and caching their conversations. Not counted: waiting for requests, and the time the
    event loop gives to the agents' code (rendering, parsing, starting tools) between steps."""
    compute_seconds: float = 0.0
    """The part of ``busy_seconds`` spent in the model and the sampler (the rest: slot and cache bookkeeping)."""
    idle_seconds: float = 0.0
    """Time the worker waited with nothing queued or running: the engine had no work. A wait is added when it
    ends; read windows with :meth:`settled`, which counts the wait in progress up to now."""
    waiting_since: float | None = None
    """``time.perf_counter()`` when the wait in progress began (None: not waiting)."""
    prefill_seconds: float = 0.0
    """The part of ``compute_seconds`` spent prefilling newly admitted prompts (the rest: decode and sampling)."""
    steps: int = 0
    rows_stepped: int = 0
    prefix_tokens_reused: int = 0
    """Prompt tokens whose keys/values came from the prefix cache instead of being recomputed."""
    slot_moves: int = 0
    """Running requests moved to a lower cache slot to keep the running set contiguous."""
    prompt_tokens: int = 0
    """Prompt tokens of every admitted request (``prefix_tokens_reused`` of them came from the cache)."""

    @property
    def mean_batch_size(self) -> float:
        return self.rows_stepped / self.steps if self.steps else 0.0

    def settled(self) -> EngineStats:
        """A copy with the wait in progress (if any) counted up to now: take one at the start of a window, as
        ``earlier`` for :meth:`since`, so that a wait begun before the window counts only from its start."""
        if self.waiting_since is None:
            return replace(self)
        now = time.perf_counter()
        return replace(self, idle_seconds=self.idle_seconds + now - self.waiting_since, waiting_since=now)

    def since(self, earlier: EngineStats, wall_s: float) -> dict[str, float]:
        """``engine/*`` metrics of the work done since ``earlier`` (:meth:`settled` then) in ``wall_s`` seconds:
        the fractions of the wall time the engine was stepping, computing, idle and prefilling, rows per step, the
        fraction of prompt tokens that came from the prefix cache, and slot moves."""
        steps, prompt = self.steps - earlier.steps, self.prompt_tokens - earlier.prompt_tokens
        idle = min(self.settled().idle_seconds - earlier.idle_seconds, wall_s)  # settled a few µs after wall_s
        return {
            "engine/busy_frac": (self.busy_seconds - earlier.busy_seconds) / max(wall_s, 1e-9),
            "engine/compute_frac": (self.compute_seconds - earlier.compute_seconds) / max(wall_s, 1e-9),
            "engine/idle_frac": idle / max(wall_s, 1e-9),
            "engine/prefill_frac": (self.prefill_seconds - earlier.prefill_seconds) / max(wall_s, 1e-9),
            "engine/mean_batch": (self.rows_stepped - earlier.rows_stepped) / max(steps, 1),
            "engine/prefix_reused_frac": (self.prefix_tokens_reused - earlier.prefix_tokens_reused) / max(prompt, 1),
            "engine/slot_moves": float(self.slot_moves - earlier.slot_moves),
        }
