"""A client of a vLLM server (OpenAI-compatible, started by the user) behind the ``Engine`` protocol.

Token ids in, token ids out: a request sends the rendered prompt ids and gets back the sampled ids and the
sampler's log-probability of each (``logprobs: 0``; vLLM's default ``raw_logprobs`` mode is ``log_softmax`` of the
unmodified logits, the same quantity the embedded engine returns), so nothing is re-tokenised. Two routes:
``/inference/v1/generate`` (token-in/token-out, served with ``--enable-scale-out``) and ``/v1/completions`` with a
token-id prompt and ``return_token_ids``. Only the caller's stop ids end a generation (``ignore_eos``), and the
stop id comes back as the last sampled id, as with the embedded engine.

Weight sync (``sync_weights``): the first sync saves every tensor of the trainer's state dict as
``model.safetensors`` into ``sync_dir`` (the base a restarted server is loaded from); each later one saves only
what trained (LoRA: the adapted layers, merged; full fine-tuning: everything; see
:mod:`harmonyrl.engine.weight_sync`) as ``update.safetensors`` in ``update_dir`` (default: memory-backed, in
``/dev/shm``), both in ``sync_dtype`` (bf16 by default). Then generation is paused (``/pause?mode=wait``: the
requests in flight finish first), the server loads the file into its parameters (``/collective_rpc`` →
``harmonyrl_load_weights``, the worker extension of :mod:`harmonyrl.engine.vllm_worker`: vLLM's own in-place
reload, with the MoE experts handed to it one expert at a time so they go through its weight loaders, the CPU MoE
prepack its update path skips, then the attention sinks it skips; a partial file loads only its layers, the
others keep their values), its weight version is set
to the RL step (``/update_weight_version``) and generation resumes. The server must run with
``VLLM_SERVER_DEV_MODE=1`` and ``--worker-extension-cls harmonyrl.engine.vllm_worker.WeightSync``. Each sample
reports the policy version the server says sampled it (:attr:`Generation.policy_version`; the oldest, should a
sample ever span a sync).

Failures: timeouts, 429 and 5xx are retried ``retries`` times with exponential backoff; a server that refuses or
drops connections (down, or restarting) is waited for until ``restart_wait_s`` has passed; then the step fails
with :class:`EngineFailure` (a harness failure, never an environment fault; the trainer stops the run with one
line, the run folder resumable). A refused request (4xx) fails at once.

**A restarted server is sent the weights again.** A vLLM server that comes back after a crash holds the weights
it was started with, not the ones synced since, and its samples are labelled ``"default"``. Once the client has
synced, a sample so labelled is not kept: the client loads the base file and then the last update into the
server again (pause, reload, version, resume, as a sync), then sends the request again with its seed. One reload
serves every request in flight (they compare the reload count they started with). The ``completions`` route
labels no sample, so there a request that lost its connection reloads the weights before its answer is kept, and
a restart no request saw (between two steps) goes unnoticed until the next sync: use the ``generate`` route.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from harmonyrl.engine.base import MetricsWindow
from harmonyrl.engine.config import VllmEngineConfig
from harmonyrl.engine.vllm_worker import SYNC_PROTOCOL
from harmonyrl.engine.weight_sync import UPDATE_FILE, memory_dir, save_tensors, sync_tensors
from harmonyrl.errors import EngineUnavailable
from harmonyrl.types import Generation, SamplingParams

if TYPE_CHECKING:
    import httpx

RETRIED_STATUS = frozenset({429, 500, 502, 503, 504})
"""Server answers worth another attempt (overloaded, restarting); any other error status fails at once."""
MAX_BACKOFF_S = 30.0
RESTART_POLL_S = 2.0
"""Longest wait between two attempts while the server is down: a restart is noticed within this."""
MAX_ATTEMPTS = 10_000
"""Bound on attempts of one request whatever the configured times (each waits at least ``backoff_s``)."""
MAX_RELOADS = 3
"""Reloads one request may trigger before a server that keeps losing its weights fails the step."""
ROUTES = {"generate": "/inference/v1/generate", "completions": "/v1/completions"}
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


class EngineFailure(RuntimeError):
    """The server failed a request after every retry, refused it, or answered nonsense: the step fails."""


def load_httpx() -> Any:
    """The optional ``httpx`` module, or a one-line error naming the extra that installs it."""
    try:
        import httpx
    except ImportError:
        raise EngineUnavailable("rollout.engine.kind=vllm needs httpx: pip install 'harmonyrl[vllm]'") from None
    return httpx


def sampling_body(params: SamplingParams, max_tokens: int) -> dict[str, Any]:
    """vLLM sampling parameters for ``params``: same temperature / top-p / top-k / seed, only the caller's stop ids
    stop (``ignore_eos``), one log-prob per sampled token (the sampled one's), ids not detokenised."""
    return {
        "max_tokens": max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,  # vLLM: -1 disables top-k (ours: 0)
        "seed": params.seed % 2**63,  # vLLM takes a signed 64-bit seed; ours is any int
        "stop_token_ids": list(params.stop_ids),
        "ignore_eos": True,
        "logprobs": 0,
        "skip_special_tokens": False,
        "detokenize": False,
    }


def request_body(
    route: Literal["generate", "completions"], model: str, prompt: list[int], params: SamplingParams, max_tokens: int
) -> dict[str, Any]:
    """The JSON body of one generation on ``route``."""
    sampling = sampling_body(params, max_tokens)
    if route == "generate":
        return {"model": model, "token_ids": prompt, "sampling_params": sampling}
    return {"model": model, "prompt": prompt, "return_token_ids": True, **sampling}


def parse_generation(
    route: Literal["generate", "completions"], body: Any, stop_ids: Sequence[int], fallback_version: int
) -> Generation:
    """A :class:`Generation` from the server's answer (raises :class:`EngineFailure` on a malformed one)."""
    try:
        choice = body["choices"][0]
        ids = tuple(int(t) for t in choice["token_ids"])
        if route == "generate":
            logprobs = tuple(float(c["logprob"]) for c in choice["logprobs"]["content"])
        else:
            logprobs = tuple(float(x) for x in choice["logprobs"]["token_logprobs"])
        version = sample_version(choice.get("weight_versions") or [], fallback_version)
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise EngineFailure(f"vLLM answered a generation without token ids and log-probs ({e!r})") from e
    if not ids or len(ids) != len(logprobs):
        raise EngineFailure(f"vLLM answered {len(ids)} token ids with {len(logprobs)} log-probs")
    reason: Literal["stop", "length"] = "stop" if ids[-1] in stop_ids else "length"
    return Generation(ids, logprobs, reason, None, version)


def unlabelled(body: Any) -> bool:
    """Whether the server labelled (part of) this sample with no synced version: ``"default"``, the label of a
    server that has not been sent weights since it started. False for an answer without labels."""
    try:
        spans = body["choices"][0].get("weight_versions") or []
        return any(not str(span["version"]).isdigit() for span in spans)
    except (KeyError, IndexError, TypeError, AttributeError):
        return False


def sample_version(spans: Sequence[Mapping[str, Any]], fallback: int) -> int:
    """The policy version of a sample from vLLM's ``weight_versions`` spans (``{"version", "start", "end"}`` over the
    output tokens): the oldest one, so a staleness bound holds for every token; ``fallback`` (the client's last
    synced version) when the server labels none with a step number (``"default"`` before the first sync)."""
    versions = [int(v) for span in spans if (v := str(span["version"])).isdigit()]
    return min(versions) if versions else fallback


def check_loaded(answer: Any) -> None:
    """Raise :class:`EngineFailure` unless every worker answered ``harmonyrl_load_weights`` with our protocol and
    no error."""
    results = answer.get("results") if isinstance(answer, dict) else None
    if not results or not all(isinstance(r, dict) and r.get("protocol") == SYNC_PROTOCOL for r in results):
        raise EngineFailure(f"vLLM answered the weight sync with {str(answer)[:200]!r}, not every worker's report")
    if errors := [r["error"] for r in results if "error" in r]:
        raise EngineFailure(f"vLLM's weight sync failed: {errors[0]}")


class VllmEngine:
    """:class:`harmonyrl.engine.base.Engine` on a vLLM server (structural, no inheritance)."""

    def __init__(
        self,
        config: VllmEngineConfig,
        vocab_size: int,
        max_seq_len: int,
        sync_dir: Path,
        transport: httpx.AsyncBaseTransport | None = None,
        trained: frozenset[str] | None = None,
    ) -> None:
        """``trained``: the names of the weights that train (LoRA: the adapted ones, see
        :func:`harmonyrl.models.lora.adapted_names`); syncs after the first send only their layers. None: all."""
        self.config, self.vocab_size, self.max_seq_len, self.sync_dir = config, vocab_size, max_seq_len, sync_dir
        self.trained = trained
        self.update_dir = Path(config.update_dir) if config.update_dir else memory_dir(sync_dir)
        self.based = False
        """Whether the server holds the base file (the first sync's, every tensor); later syncs send updates."""
        self.updated = False
        """Whether :attr:`update_dir` holds an update the server loaded on top of the base."""
        self.sync_bytes = self.last_sync_bytes = 0
        self._transport = transport  # tests pass an httpx.MockTransport
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots: asyncio.Semaphore | None = None
        self._lock: asyncio.Lock | None = None
        """Held by a sync or a reload: one at a time, never beside each other."""
        self.policy_version = 0
        self.synced: int | None = None
        """The version of the file in :attr:`sync_dir` once a sync has completed (None: none yet, or one failed)."""
        self.requests = self.tokens = self.retries = self.reloads = 0
        self.sync_seconds = 0.0

    # ---------------------------------------------------------------- Engine protocol

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        """Sample a continuation of ``prompt_ids`` on the server (at most ``max_concurrency`` in flight)."""
        prompt = [int(t) for t in prompt_ids]
        if not prompt or len(prompt) >= self.max_seq_len:
            raise ValueError(f"prompt has {len(prompt)} tokens; need 1 <= len(prompt) < max_seq_len={self.max_seq_len}")
        if bad := [t for t in prompt if not 0 <= t < self.vocab_size]:
            raise ValueError(f"prompt ids out of range [0, {self.vocab_size}): {bad[:5]}")
        limit = min(params.max_new_tokens, self.max_seq_len - len(prompt))
        route = self.config.route
        body = request_body(route, self.config.model, prompt, params, limit)
        client, slots = self._connection()
        for _ in range(MAX_RELOADS + 1):
            reloads = self.reloads
            async with slots:
                answer, dropped = await self._send(client, ROUTES[route], body)
            if not self._lost_weights(answer, dropped, route):
                break
            await self._reload(reloads)  # a restarted server: the synced weights again, then the same request
        else:
            raise EngineFailure(
                f"vLLM server {self.config.url} lost its weights {MAX_RELOADS + 1} times in one request "
                "(it keeps restarting)"
            )
        generation = parse_generation(route, answer, params.stop_ids, self.policy_version)
        self.requests, self.tokens = self.requests + 1, self.tokens + len(generation.token_ids)
        return generation

    async def sync_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Save ``state_dict`` (the first time every tensor, then only what trained) and have the server load it,
        generation paused around it."""
        if self.config.weight_sync == "none":
            return
        start = time.perf_counter()
        dtype = DTYPES[self.config.sync_dtype]
        async with self._guard():
            self.synced = None  # the file changes now; until the server holds it, nothing can be reloaded
            if not self.based:  # every tensor, the base a restarted server is loaded from
                moved = save_tensors(sync_tensors(state_dict, None, dtype), self.sync_dir / "model.safetensors")
                self.updated = False
                await self._load(version, base=True, update=False)
                self.based = True
            else:
                update = sync_tensors(state_dict, self.trained, dtype)
                moved = save_tensors(update, self.update_dir / UPDATE_FILE)
                del update
                self.updated = True
                await self._load(version, base=False, update=True)
            self.policy_version = self.synced = version
        self.last_sync_bytes, self.sync_bytes = moved, self.sync_bytes + moved
        self.sync_seconds += time.perf_counter() - start

    def _lost_weights(self, answer: Any, dropped: bool, route: str) -> bool:
        """Whether ``answer`` may come from a server that restarted since the last sync (module docstring)."""
        if self.synced is None or self.config.weight_sync == "none":
            return False
        return unlabelled(answer) or (dropped and route == "completions")

    async def _reload(self, seen: int) -> None:
        """Load the last synced weights into the server again, unless a reload happened since the caller's request
        was sent (``seen``: :attr:`reloads` then)."""
        async with self._guard():
            if self.reloads != seen:
                return
            if self.synced is None:
                raise EngineFailure(f"vLLM server {self.config.url} lost its weights and no complete sync is saved")
            await self._load(self.synced, base=True, update=self.updated)
            self.reloads += 1

    async def _load(self, version: int, base: bool, update: bool) -> None:
        """Pause generation, have the server load the base file (``base``) and then the update (``update``), label
        it ``version``, resume."""
        client, _ = self._connection()
        await self._post(client, "/pause", None, {"mode": "wait"})
        try:
            if base:
                rpc = {"method": "harmonyrl_load_weights", "kwargs": {"weights_path": str(self.sync_dir)}}
                check_loaded(await self._post(client, "/collective_rpc", rpc))
            if update:
                kwargs = {"weights_path": str(self.update_dir / UPDATE_FILE), "partial": True}
                check_loaded(
                    await self._post(client, "/collective_rpc", {"method": "harmonyrl_load_weights", "kwargs": kwargs})
                )
            await self._post(client, "/update_weight_version", {"new_version": str(version)})
        except EngineFailure:  # generation resumes after a failed load; one attempt: the server may be gone
            with contextlib.suppress(EngineFailure):
                await self._send(client, "/resume", None, patient=False)
            raise
        await self._post(client, "/resume", None)

    def _guard(self) -> asyncio.Lock:
        self._connection()
        assert self._lock is not None
        return self._lock

    def metrics_window(self) -> MetricsWindow:
        """``engine/*`` metrics of a window: requests, tokens per second, retries, reloads into a restarted server
        and weight-sync time."""
        requests, tokens, retries, sync = self.requests, self.tokens, self.retries, self.sync_seconds
        reloads, moved = self.reloads, self.sync_bytes

        def close(wall_s: float) -> dict[str, float]:
            return {
                "engine/requests": float(self.requests - requests),
                "engine/tokens_per_s": (self.tokens - tokens) / max(wall_s, 1e-9),
                "engine/retries": float(self.retries - retries),
                "engine/reloads": float(self.reloads - reloads),
                "engine/sync_s": self.sync_seconds - sync,
                "engine/sync_bytes": float(self.sync_bytes - moved),
            }

        return close

    async def close(self) -> None:
        """Close the HTTP connections (requests in flight are cancelled by their callers)."""
        if self._client is not None and self._loop is not None and not self._loop.is_closed():
            await self._client.aclose()
        self._client, self._loop, self._slots, self._lock = None, None, None, None

    # ---------------------------------------------------------------- HTTP

    def _connection(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        """The client and concurrency limit of the running event loop (a new ``asyncio.run`` gets new ones)."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._slots is None or self._loop is not loop:
            httpx = load_httpx()
            c = self.config
            timeout = httpx.Timeout(c.request_timeout_s, connect=c.connect_timeout_s)
            limits = httpx.Limits(max_connections=c.max_concurrency + 4)  # + the sync calls
            self._client = httpx.AsyncClient(base_url=c.url, timeout=timeout, limits=limits, transport=self._transport)
            self._loop, self._slots, self._lock = loop, asyncio.Semaphore(c.max_concurrency), asyncio.Lock()
        return self._client, self._slots

    async def _post(
        self, client: httpx.AsyncClient, path: str, body: Any, params: Mapping[str, str] | None = None
    ) -> Any:
        """POST with bounded retries (see :meth:`_send`); the parsed JSON (None if empty)."""
        return (await self._send(client, path, body, params))[0]

    async def _send(
        self,
        client: httpx.AsyncClient,
        path: str,
        body: Any,
        params: Mapping[str, str] | None = None,
        patient: bool = True,
    ) -> tuple[Any, bool]:
        """POST; the parsed JSON and whether a connection was refused or dropped on the way. Timeouts, 429 and 5xx
        are retried ``retries`` times; refused or dropped connections until ``restart_wait_s`` has passed since
        the first (a server restarting); the wait doubles from ``backoff_s``. Not ``patient``: one attempt."""
        httpx = load_httpx()
        c = self.config
        if not patient:
            c = c.model_copy(update={"retries": 0, "restart_wait_s": 0.0})
        delay, retried, down_since, last = c.backoff_s, 0, None, ""
        for _ in range(MAX_ATTEMPTS):
            try:
                response = await client.post(path, json=body, params=params)
            except (httpx.ConnectError, httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError) as e:
                last = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
                down_since = time.monotonic() if down_since is None else down_since
                down_s = time.monotonic() - down_since
                if down_s >= c.restart_wait_s and retried >= c.retries:
                    raise EngineFailure(
                        f"vLLM server {c.url} did not answer {path} for {down_s:.1f} s "
                        f"(rollout.engine.restart_wait_s={c.restart_wait_s:g}); last: {last}"
                    ) from None
                wait = min(delay, RESTART_POLL_S) if down_s < c.restart_wait_s else delay
            except httpx.TransportError as e:  # timeouts
                last = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
                if retried >= c.retries:
                    break
                wait = delay
            else:
                if response.status_code < 400:
                    return _json(response, path), down_since is not None
                last = f"HTTP {response.status_code}: {_detail(response)}"
                if response.status_code not in RETRIED_STATUS:
                    raise EngineFailure(f"vLLM server {c.url} refused {path}: {last}")
                if retried >= c.retries:
                    break
                wait = delay
            retried += 1
            self.retries += 1
            await asyncio.sleep(wait)
            delay = min(delay * 2, MAX_BACKOFF_S)
        raise EngineFailure(f"vLLM server {c.url} failed {path} {retried + 1} times; last: {last}")


def _json(response: httpx.Response, path: str) -> Any:
    if not response.content:
        return None
    try:
        return response.json()
    except json.JSONDecodeError as e:
        raise EngineFailure(f"vLLM answered {path} with something that is not JSON: {response.text[:100]!r}") from e


def _detail(response: httpx.Response) -> str:
    """The server's error message, on one line."""
    try:
        body = response.json()
    except json.JSONDecodeError:
        return response.text[:200].replace("\n", " ")
    message = body.get("message") or body.get("detail") or body.get("error") if isinstance(body, dict) else body
    return str(message)[:300].replace("\n", " ")
