"""The embedded engine: async, continuously batching, KV-cached sampling in the trainer's process.

How it runs: ``generate`` validates, enqueues and awaits a future. One worker coroutine (started lazily on
the caller's event loop) repeats *admit → step → advance*:

* admit: running requests are first moved down into slots that finished ones freed (so the running set is
  one contiguous run of slots, read as views), then pending requests take the next free slots (FIFO, up to
  ``max_batch``); cancelled ones are dropped.
* step: a prefill of the newly admitted prompts (each after the longest cached prefix it starts with:
  :mod:`harmonyrl.engine.local.prefill`, batch-invariant with the compiled step) plus one batched decode step
  for the rows already running, then one batched sampling call for all of them. It runs on the event loop's
  own thread, then yields once: every agent loop whose generation just finished runs up to its next
  ``await`` first, so a request it sends at once joins the next step. Tool threads keep running during a
  step; coroutines (async tools, timeouts) wait for its end, at most one step late.
* advance: append the sampled tokens, finish rows (stop id / ``max_new_tokens`` / ``max_seq_len``), cache
  a finished row's keys/values for its conversation's next turn, free its slot, resolve futures. New
  requests therefore join, and finished ones leave, between decode steps.

Why the loop's thread and not a worker thread: the step is torch work, and torch's OpenMP thread team is
per calling thread. A worker thread needs a second team next to the trainer's; two teams of 2 on 2 cores
make libgomp's barriers sleep and wake on every op (measured: a micro × 32-row decode step 6 ms → 14 ms,
and the trainer's main-thread ops slow down as much afterwards), so a worker had to run on 1 thread, which
halves prefill speed. On the loop's thread the engine shares the trainer's team at full width
(``benchmarks/engine.py``: 0.87 → 0.66–0.72 s; ``benchmarks/overlap.py``: 10.2 → 12.8 episodes/s). What
the loop thread gives up, overlapping agent-side Python with a step, was little: both hold the GIL.

Weights (:mod:`.weights`): a copy of its own by default, cast straight to the engine's dtype; or, with
``share_weights``, the trainer's own tensors wherever device and dtype agree (the synchronous pipeline: the
trainer updates them between rollout phases, and a sync only rebuilds what the engine derives from them). The
engine's bytes beyond the trainer's are :meth:`LocalEngine.memory`.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from transformers import GptOssForCausalLM

from harmonyrl.engine.base import MetricsWindow
from harmonyrl.engine.local import weights
from harmonyrl.engine.local.forward import LeanForward
from harmonyrl.engine.local.native import KernelChoice, NativeDecode, use_native
from harmonyrl.engine.local.prefill import MIN_PREFIX, Prefill
from harmonyrl.engine.local.prefix_cache import CachedPrefix, PrefixCache
from harmonyrl.engine.local.routing_capture import EngineRouting
from harmonyrl.engine.local.sampling import RowParams, sample, seed_key, validate_request
from harmonyrl.engine.local.stats import EngineStats
from harmonyrl.types import Generation, Routing, SamplingParams


@dataclass(frozen=True)
class EngineMemory:
    """Bytes the engine holds beyond the weights it shares, by what they are for (:meth:`LocalEngine.memory`)."""

    weights: int
    """Model tensors the engine owns: all of them when it copies; with ``share_weights`` only those it could not
    share (another dtype or device) or computes itself (LoRA's merged ``W + BA``)."""
    derived: int
    """What the forward derives from the weights: fp32 norm weights (a bf16 engine), q/k/v biases, RoPE tables."""
    panels: int
    """The compiled step's weight panels (``kernel=native``, CPU fp32): an input-major copy of every weight."""
    kv_cache: int
    routing: int
    prefix_cache: int

    @property
    def total(self) -> int:
        return self.weights + self.derived + self.panels + self.kv_cache + self.routing + self.prefix_cache


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
        prefix_cache_mib: float = 256.0,
        kernel: KernelChoice = "auto",
        device: torch.device | None = None,
        share_weights: bool = False,
    ) -> None:
        """``device``: where the engine's weights, its KV cache and its decode run (default: the model's); the
        compiled C step (``kernel`` native) runs on the CPU only. ``share_weights``: use ``model``'s own tensors
        wherever they already have ``device`` and ``dtype`` (LoRA adapters: merged copies of the adapted tensors
        only), for a caller that never changes them while a generation runs (:mod:`.weights`)."""
        if max_batch < 1 or max_seq_len < 2:
            raise ValueError(f"need max_batch >= 1 and max_seq_len >= 2, got {max_batch}, {max_seq_len}")
        if not 0 <= prefix_cache_mib < float("inf"):
            raise ValueError(f"prefix_cache_mib must be finite and >= 0 (0 turns caching off), got {prefix_cache_mib}")
        self.max_batch = max_batch
        self.max_seq_len = max_seq_len
        self.vocab_size = int(model.config.vocab_size)
        # transformers wraps PreTrainedModel.to with functools.wraps(Module.to), which types it as unbound
        self.device = device if device is not None else model.lm_head.weight.device
        if kernel == "native" and self.device.type != "cpu":
            raise ValueError(f"kernel='native' is the compiled CPU step; the engine is on {self.device}")
        self.share_weights = share_weights
        self._model = weights.build(model, self.device, dtype, share_weights)
        self._fwd = LeanForward(self._model, max_batch, max_seq_len, sinks=sinks)
        on_cpu = self.device.type == "cpu"
        self._native = NativeDecode(self._fwd) if on_cpu and use_native(kernel, model.config, dtype) else None
        """The compiled decode step, or None: decode runs ``LeanForward.decode`` (eager torch)."""
        self._routing = EngineRouting(self._model, max_batch, max_seq_len) if record_routing else None
        """Experts chosen per position (:mod:`.routing_capture`), returned as ``Generation.routing``."""
        self.stats = EngineStats()
        self.policy_version = 0
        """The ``version`` of the last :meth:`sync_weights` (0: the weights it was built with)."""
        self._pending: deque[_Request] = deque()
        self._active: list[_Request] = []
        self._free: list[int] = list(range(max_batch))
        self._worker: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup: asyncio.Event | None = None
        self._closing = False
        self._prefixes = PrefixCache(int(prefix_cache_mib * 2**20))
        """Keys/values of shared prompt heads and of finished conversations (:mod:`.prefix_cache`)."""
        self._prefill = Prefill(self._fwd, self._native, self._prefixes, self._routing, self.stats)
        """New prompts into their slots after their longest cached prefix (:mod:`.prefill`)."""
        self._settings = (dtype, sinks, prefix_cache_mib)
        """What :meth:`replica` builds its copy with, beside the attributes above."""

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
        """New weights (plain GptOss names, strict key match; dtype converted): copied into the engine's own
        tensors, or, sharing, taken as they are where they fit; then what the engine derives is rebuilt and the
        prefix cache (keys of the old weights) cleared."""
        if self.num_in_flight:
            raise RuntimeError(
                f"load_weights called with {self.num_in_flight} requests in flight; "
                "sync weights between RL steps, when no generate() is pending"
            )
        weights.load(self._model, state_dict, self.share_weights, self.device)
        self._fwd.refresh()
        if self._native is not None:
            self._native.refresh()
        self._prefixes.clear()  # cached keys/values belong to the old weights

    async def sync_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """The ``Engine`` protocol's weight sync, in process (:meth:`load_weights`): a copy, or nothing to move
        when the engine shares the trainer's tensors."""
        self.load_weights(state_dict)
        self.policy_version = version

    def replica(self) -> LocalEngine:
        """A second engine with the same settings and a copy of the weights this one holds now (its version too),
        but its own KV cache, prefix cache and worker: the async pipeline runs batches of different policy
        versions on copies at once (docs/async.md). A row's result does not depend on which copy runs it.
        Always a copy, even of a sharing engine: a replica samples a version the trainer has moved on from."""
        dtype, sinks, prefix_cache_mib = self._settings
        copy_ = LocalEngine(
            self._model,
            max_batch=self.max_batch,
            max_seq_len=self.max_seq_len,
            dtype=dtype,
            sinks=sinks,
            record_routing=self._routing is not None,
            prefix_cache_mib=prefix_cache_mib,
            kernel="native" if self._native is not None else "torch",
            device=self.device,
        )
        copy_.policy_version = self.policy_version
        return copy_

    def memory(self, beside: torch.nn.Module | None = None) -> EngineMemory:
        """The bytes this engine holds, counted by storage, leaving out tensors of ``beside`` (the trainer's model,
        whose tensors a sharing engine uses): what the engine adds to the process."""
        model = [*self._model.parameters(), *self._model.buffers()]
        theirs = set() if beside is None else weights.storages([*beside.parameters(), *beside.buffers()])
        derived = self._fwd.derived()
        counted = theirs | weights.storages(model) | weights.storages(derived)
        return EngineMemory(
            weights=weights.tensor_bytes(model, theirs),
            derived=weights.tensor_bytes(derived, theirs | weights.storages(model)),
            panels=0 if self._native is None else weights.tensor_bytes(self._native.tensors, counted),
            kv_cache=self._fwd.cache.nbytes,
            routing=0 if self._routing is None else self._routing.buffer.nbytes,
            prefix_cache=self._prefixes.nbytes,
        )

    def metrics_window(self) -> MetricsWindow:
        """Open a window over :attr:`stats`; closing it gives the ``engine/*`` metrics of the work done in it."""
        before = self.stats.settled()
        return lambda wall_s: self.stats.since(before, wall_s)

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

    @property
    def kernel(self) -> str:
        """The decode step in use: ``native`` (compiled) or ``torch`` (eager)."""
        return "torch" if self._native is None else "native"

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
                    waited_from = self.stats.waiting_since = time.perf_counter()
                    try:
                        await wakeup.wait()
                    finally:
                        self.stats.idle_seconds += time.perf_counter() - waited_from
                        self.stats.waiting_since = None
                    continue
                start = time.perf_counter()
                self._compact()
                new, old = self._admit(), sorted(self._active, key=lambda r: r.slot)
                self._active.extend(new)
                try:
                    tokens, logprobs = self._compute(new, old)
                except Exception as exc:  # a failed step fails its requests, not the engine
                    self._finish_all(new + old, exc)
                else:
                    self._advance(new + old, tokens, logprobs)
                self.stats.busy_seconds += time.perf_counter() - start
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

    def _compact(self) -> None:
        """Move running requests into the lowest slots, so that a decode step reads the cache as views of one
        contiguous run of slots instead of gathering scattered ones (measured, micro × 33 rows at positions
        130..330: 12.9 ms per decode step scattered, 8.3 ms contiguous). A move copies the positions the request
        has fed so far, once; finished requests leave holes at any slot, so without it the holes spread."""
        n = len(self._active)
        used = {r.slot for r in self._active}
        holes = [slot for slot in range(n) if slot not in used]
        movers = sorted((r for r in self._active if r.slot >= n), key=lambda r: r.slot)
        for request, hole in zip(movers, holes, strict=True):
            fed = len(request.prompt) + len(request.tokens) - 1  # the last sampled token is not in the cache yet
            self._fwd.move(request.slot, hole, fed)
            if self._routing is not None:
                self._routing.move(request.slot, hole, fed)
            self._free.remove(hole)
            self._free.append(request.slot)
            request.slot = hole
            self.stats.slot_moves += 1
        self._free.sort()

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
                reason: Literal["stop", "length"] = "stop" if token in request.stops else "length"
                fed = len(request.prompt) + len(request.tokens) - 1  # every position fed: all but the last token
                routing = self._routing.read(request.slot, fed) if self._routing is not None else None
                self._keep_conversation(request, fed, routing)
                kept = None if routing is None else Routing(routing.clone())
                result = Generation(tuple(request.tokens), tuple(request.logprobs), reason, kept, self.policy_version)
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
                parts.append(self._prefill([r.prompt for r in new], [r.slot for r in new]))
                self.stats.prefill_seconds += time.perf_counter() - start
            if old:
                parts.append(self._decode(old))
            logits = parts[0] if len(parts) == 1 else torch.cat(parts)
            tokens, logprobs = sample(logits, self._row_params(new + old))
            out = tokens.tolist(), logprobs.tolist()
        self.stats.compute_seconds += time.perf_counter() - start
        self.stats.steps += 1
        self.stats.rows_stepped += len(new) + len(old)
        self.stats.tokens_generated += len(new) + len(old)
        return out

    def _keep_conversation(self, request: _Request, fed: int, routing: torch.Tensor | None) -> None:
        """Cache a finished request's keys/values (every position it fed) under the ids it fed: its agent's
        next turn re-sends them, then prefills only the last sampled token and the tool result."""
        if fed < MIN_PREFIX or not self._prefixes.budget_bytes:
            return
        kv = self._fwd.cache.snapshot(request.slot, fed)
        self._prefixes.put(tuple(request.prompt + request.tokens[:-1]), CachedPrefix(kv, routing))

    def _decode(self, rows: list[_Request]) -> torch.Tensor:
        # the last sampled token is not in the cache yet: it goes in at position len(prompt) + n - 1
        positions = [len(r.prompt) + len(r.tokens) - 1 for r in rows]
        tokens, slots = torch.tensor([r.tokens[-1] for r in rows], device=self.device), [r.slot for r in rows]
        if self._native is not None:
            pos_t, slot_t = torch.tensor(positions), torch.tensor(slots)  # host: the C step is a CPU path
            logits, ids = self._native(tokens, pos_t, slot_t, record=self._routing is not None)
            if self._routing is not None and ids is not None:
                self._routing.write_decode(slot_t, pos_t, ids)
            return logits
        logits = self._fwd.decode(tokens, positions, slots)
        if self._routing is not None:
            self._routing.after_decode(
                torch.tensor(slots, device=self.device), torch.tensor(positions, device=self.device)
            )
        return logits

    def _row_params(self, rows: list[_Request]) -> RowParams:
        ps, on = [r.params for r in rows], self.device
        return RowParams(
            temperature=torch.tensor([p.temperature for p in ps], dtype=torch.float32, device=on),
            top_k=torch.tensor([p.top_k for p in ps], dtype=torch.int64, device=on),
            top_p=torch.tensor([p.top_p for p in ps], dtype=torch.float32, device=on),
            keys=torch.tensor([r.key for r in rows], dtype=torch.int64, device=on),
            counters=torch.tensor([len(r.tokens) for r in rows], dtype=torch.int64, device=on),
            filtered=any(p.top_k > 0 or p.top_p < 1.0 for p in ps),
        )
