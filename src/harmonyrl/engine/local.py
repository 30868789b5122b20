"""The embedded engine: async, continuously batching, KV-cached sampling in the trainer's process.

How it runs: ``generate`` validates, enqueues and awaits a future. One worker coroutine (started lazily on
the caller's event loop) repeats *admit → step → advance*:

* admit: pending requests take free cache slots (FIFO, up to ``max_batch``); cancelled ones are dropped.
* step: a batched prefill of the newly admitted prompts plus one batched decode step for the rows already
  running, then one batched sampling call for all of them. It runs on the event loop's own thread, then
  yields once: every agent loop whose generation just finished runs up to its next ``await`` first, so a
  request it sends at once joins the next step. Tool threads keep running during a step; coroutines
  (async tools, timeouts) wait for its end, at most one step late.
* advance: append the sampled tokens, finish rows (stop id / ``max_new_tokens`` / ``max_seq_len``), free
  their slots, resolve futures. New requests therefore join, and finished ones leave, between decode steps.

Why the loop's thread and not a worker thread: the step is torch work, and torch's OpenMP thread team is
per calling thread. A worker thread needs a second team next to the trainer's; two teams of 2 on 2 cores
make libgomp's barriers sleep and wake on every op (measured: a micro × 32-row decode step 6 ms → 14 ms,
and the trainer's main-thread ops slow down as much afterwards), so a worker had to run on 1 thread, which
halves prefill speed. On the loop's thread the engine shares the trainer's team at full width
(``benchmarks/engine.py``: 0.87 → 0.66–0.72 s; ``benchmarks/overlap.py``: 10.2 → 12.8 episodes/s). What
the loop thread gives up, overlapping agent-side Python with a step, was little: both hold the GIL.

The engine owns a private deep copy of the model (the trainer keeps training its own); ``load_weights``
copies new weights in between RL steps.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from transformers import GptOssForCausalLM

from harmonyrl.engine.forward import LeanForward
from harmonyrl.engine.routing import EngineRouting
from harmonyrl.engine.sampling import RowParams, sample, seed_key, validate_request
from harmonyrl.types import Generation, Routing, SamplingParams

MIN_PREFIX = 16
"""Shortest prompt prefix worth caching: shorter ones cost more in bookkeeping than they save."""
MAX_PREFIXES = 8
"""Cached prefixes kept (least recently used dropped first): one per environment in a typical run."""


@dataclass
class EngineStats:
    """Counters for benchmarks: utilisation = ``busy_seconds / wall`` over the caller's window."""

    tokens_generated: int = 0
    busy_seconds: float = 0.0
    steps: int = 0
    rows_stepped: int = 0
    prefix_tokens_reused: int = 0
    """Prompt tokens whose keys/values came from the shared-prefix cache instead of being recomputed."""

    @property
    def mean_batch_size(self) -> float:
        return self.rows_stepped / self.steps if self.steps else 0.0


@dataclass
class _Request:
    prompt: list[int]
    params: SamplingParams
    future: asyncio.Future[Generation]
    limit: int  # max tokens to generate: min(max_new_tokens, max_seq_len - len(prompt))
    stops: frozenset[int]
    key: int  # seed key for the counter-based noise
    slot: int = -1
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


class LocalEngine:
    """In-process implementation of :class:`harmonyrl.engine.base.Engine` (structural, no inheritance)."""

    def __init__(
        self,
        model: GptOssForCausalLM,
        max_batch: int = 64,
        max_seq_len: int = 1024,
        dtype: torch.dtype = torch.float32,
        sinks: bool = True,
        record_routing: bool = True,
    ) -> None:
        if max_batch < 1 or max_seq_len < 2:
            raise ValueError(f"need max_batch >= 1 and max_seq_len >= 2, got {max_batch}, {max_seq_len}")
        self.max_batch = max_batch
        self.max_seq_len = max_seq_len
        self.vocab_size = int(model.config.vocab_size)
        self._model = copy.deepcopy(model).to(dtype).eval().requires_grad_(False)
        self._fwd = LeanForward(self._model, max_batch, max_seq_len, sinks=sinks)
        self._routing = EngineRouting(self._model, max_batch, max_seq_len) if record_routing else None
        """Experts chosen per position (:mod:`harmonyrl.engine.routing`), returned as ``Generation.routing``."""
        self.stats = EngineStats()
        self._pending: deque[_Request] = deque()
        self._active: list[_Request] = []
        self._free: list[int] = list(range(max_batch))
        self._worker: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup: asyncio.Event | None = None
        self._closing = False
        self._prefixes: OrderedDict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = OrderedDict()

    # ---------------------------------------------------------------- public API

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        """Sample a continuation of ``prompt_ids``; concurrent calls share batched forward passes."""
        prompt = validate_request(prompt_ids, params, self.max_seq_len, self.vocab_size)
        self._ensure_worker()
        assert self._loop is not None and self._wakeup is not None
        request = _Request(
            prompt=prompt,
            params=params,
            future=self._loop.create_future(),
            limit=min(params.max_new_tokens, self.max_seq_len - len(prompt)),
            stops=frozenset(params.stop_ids),
            key=seed_key(params.seed),
        )
        self._pending.append(request)
        self._wakeup.set()
        return await request.future  # cancelling the caller cancels the future; the worker frees the slot

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Copy new weights into the engine's private model (strict key match; dtype converted)."""
        if self.num_in_flight:
            raise RuntimeError(
                f"load_weights called with {self.num_in_flight} requests in flight; "
                "sync weights between RL steps, when no generate() is pending"
            )
        with torch.no_grad():
            self._model.load_state_dict(dict(state_dict), strict=True)
        self._fwd.refresh()
        self._prefixes.clear()  # cached keys/values belong to the old weights

    async def close(self) -> None:
        """Stop the worker after its current step; pending and running requests are cancelled."""
        worker = self._worker
        if worker is not None and not worker.done():
            self._closing = True
            assert self._wakeup is not None
            self._wakeup.set()
            await asyncio.wait([worker])
        self._abandon_all()
        self._worker, self._loop, self._wakeup = None, None, None
        self._closing = False

    @property
    def num_in_flight(self) -> int:
        """Requests queued or running (not yet resolved)."""
        return len(self._pending) + len(self._active)

    @property
    def num_free_slots(self) -> int:
        return len(self._free)

    # ---------------------------------------------------------------- worker

    def _ensure_worker(self) -> None:
        """Start the worker on the running loop if it is not running there (e.g. a new ``asyncio.run``)."""
        loop = asyncio.get_running_loop()
        if self._worker is not None and not self._worker.done() and self._loop is loop:
            return
        if self._worker is not None and not self._worker.done():
            raise RuntimeError("LocalEngine is already serving another running event loop")
        self._abandon_all()  # requests left by a previous (dead) loop can never be resolved
        self._loop, self._wakeup = loop, asyncio.Event()
        self._worker = loop.create_task(self._run(), name="harmonyrl-engine")

    async def _run(self) -> None:
        assert self._wakeup is not None
        wakeup = self._wakeup
        try:
            while not self._closing:
                self._drop_cancelled()
                if not self._pending and not self._active:
                    wakeup.clear()
                    await wakeup.wait()
                    continue
                new, old = self._admit(), sorted(self._active, key=lambda r: r.slot)
                self._active.extend(new)
                try:
                    tokens, logprobs = self._compute(new, old)
                except Exception as exc:  # a failed step fails its requests, not the engine
                    self._finish_all(new + old, exc)
                else:
                    self._advance(new + old, tokens, logprobs)
                await asyncio.sleep(0)  # let the agent loops just resolved send their next requests
        except BaseException as exc:
            self._abandon_all(exc if isinstance(exc, Exception) else None)
            raise

    def _drop_cancelled(self) -> None:
        if any(r.future.done() for r in self._pending):
            self._pending = deque(r for r in self._pending if not r.future.done())
        for r in [r for r in self._active if r.future.done()]:
            self._release(r)

    def _admit(self) -> list[_Request]:
        new: list[_Request] = []
        while self._pending and self._free:
            request = self._pending.popleft()
            request.slot = self._free.pop(0)
            new.append(request)
        self._free.sort()  # lowest slots first keeps the active set contiguous more often
        return new

    def _release(self, request: _Request) -> None:
        self._active.remove(request)
        self._free.append(request.slot)
        self._free.sort()

    def _advance(self, rows: list[_Request], tokens: list[int], logprobs: list[float]) -> None:
        """Append one sampled token per row; resolve finished rows and free their slots."""
        for request, token, logprob in zip(rows, tokens, logprobs, strict=True):
            if request.future.done():  # cancelled while the step ran
                self._release(request)
                continue
            request.tokens.append(token)
            request.logprobs.append(logprob)
            if token in request.stops or len(request.tokens) >= request.limit:
                reason = "stop" if token in request.stops else "length"
                routing = None
                if self._routing is not None:  # every position fed to the model: all but the last token
                    fed = len(request.prompt) + len(request.tokens) - 1
                    routing = Routing(self._routing.read(request.slot, fed))
                result = Generation(tuple(request.tokens), tuple(request.logprobs), reason, routing)
                request.future.set_result(result)
                self._release(request)

    def _finish_all(self, rows: list[_Request], exc: Exception) -> None:
        for request in rows:
            if not request.future.done():
                request.future.set_exception(exc)
            if request in self._active:
                self._release(request)

    def _abandon_all(self, exc: Exception | None = None) -> None:
        """Cancel (or fail with ``exc``) everything queued or running and free every slot."""
        for request in [*self._pending, *self._active]:
            if not request.future.done() and not request.future.get_loop().is_closed():
                if exc is None:
                    request.future.cancel()
                else:
                    request.future.set_exception(exc)
        self._pending.clear()
        self._active.clear()
        self._free = list(range(self.max_batch))

    # ---------------------------------------------------------------- compute

    def _compute(self, new: list[_Request], old: list[_Request]) -> tuple[list[int], list[float]]:
        """Prefill ``new`` rows, decode ``old`` rows, sample all; returns host lists in ``new + old`` order."""
        start = time.perf_counter()
        with torch.inference_mode():
            parts = []
            if new:
                parts.append(self._prefill(new))
            if old:
                parts.append(self._decode(old))
            logits = parts[0] if len(parts) == 1 else torch.cat(parts)
            tokens, logprobs = sample(logits, self._row_params(new + old))
            out = tokens.tolist(), logprobs.tolist()
        self.stats.busy_seconds += time.perf_counter() - start
        self.stats.steps += 1
        self.stats.rows_stepped += len(new) + len(old)
        self.stats.tokens_generated += len(new) + len(old)
        return out

    def _prefill(self, rows: list[_Request]) -> torch.Tensor:
        """Logits ``[n, V]`` for newly admitted rows, in ``rows`` order; shared prefixes are reused."""
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, r in enumerate(rows):
            groups.setdefault(self._prefix_for(r.prompt), []).append(i)
        if () in groups and len(groups[()]) >= 2:  # rows no cached prefix covers: cache what they share
            common = _common_prefix([rows[i].prompt for i in groups[()]])
            if len(common) >= MIN_PREFIX:
                self._store_prefix(common)
                groups.setdefault(common, []).extend(groups.pop(()))
        out = torch.empty(len(rows), self.vocab_size)
        for prefix, idx in groups.items():
            p = len(prefix)
            tails = [rows[i].prompt[p:] for i in idx]
            padded = torch.zeros(len(idx), max(len(t) for t in tails), dtype=torch.long)
            for j, tail in enumerate(tails):
                padded[j, : len(tail)] = torch.tensor(tail)
            slots = torch.tensor([rows[i].slot for i in idx])
            if self._routing is not None:
                self._routing.clear(slots)
            if p:
                self._prefixes.move_to_end(prefix)
                self._fwd.load_prefix(self._prefixes[prefix], slots)
                self.stats.prefix_tokens_reused += p * len(idx)
                if self._routing is not None:
                    self._routing.load_prefix(prefix, slots)
            lengths = torch.tensor([len(t) for t in tails])
            out[torch.tensor(idx)] = self._fwd.prefill(padded, lengths, slots, start=p)
            if self._routing is not None:
                self._routing.after_prefill(slots, p, padded.shape[1], lengths)
        return out

    def _prefix_for(self, prompt: list[int]) -> tuple[int, ...]:
        """The longest cached prefix ``prompt`` starts with (and extends by ≥ 1 token), or ``()``."""
        best: tuple[int, ...] = ()
        for prefix in self._prefixes:
            if len(best) < len(prefix) < len(prompt) and tuple(prompt[: len(prefix)]) == prefix:
                best = prefix
        return best

    def _store_prefix(self, prefix: tuple[int, ...]) -> None:
        self._prefixes[prefix] = self._fwd.prefix(torch.tensor(prefix))
        while len(self._prefixes) > MAX_PREFIXES:
            self._prefixes.popitem(last=False)  # least recently used
        if self._routing is not None:
            self._routing.after_prefix(prefix)
            self._routing.keep_prefixes(self._prefixes)

    def _decode(self, rows: list[_Request]) -> torch.Tensor:
        # the last sampled token is not in the cache yet: it goes in at position len(prompt) + n - 1
        positions = [len(r.prompt) + len(r.tokens) - 1 for r in rows]
        tokens = torch.tensor([r.tokens[-1] for r in rows])
        logits = self._fwd.decode(tokens, positions, [r.slot for r in rows])
        if self._routing is not None:
            self._routing.after_decode(torch.tensor([r.slot for r in rows]), torch.tensor(positions))
        return logits

    @staticmethod
    def _row_params(rows: list[_Request]) -> RowParams:
        ps = [r.params for r in rows]
        return RowParams(
            temperature=torch.tensor([p.temperature for p in ps], dtype=torch.float32),
            top_k=torch.tensor([p.top_k for p in ps], dtype=torch.int64),
            top_p=torch.tensor([p.top_p for p in ps], dtype=torch.float32),
            keys=torch.tensor([r.key for r in rows], dtype=torch.int64),
            counters=torch.tensor([len(r.tokens) for r in rows], dtype=torch.int64),
            filtered=any(p.top_k > 0 or p.top_p < 1.0 for p in ps),
            any_greedy=any(p.temperature <= 0 for p in ps),
            unit_temperature=all(p.temperature == 1.0 for p in ps),
        )


def _common_prefix(prompts: Sequence[list[int]]) -> tuple[int, ...]:
    """Longest common prefix of ``prompts``, leaving every prompt at least one token to prefill."""
    limit = min(len(p) for p in prompts) - 1
    n = 0
    while n < limit and all(p[n] == prompts[0][n] for p in prompts):
        n += 1
    return tuple(prompts[0][:n])
