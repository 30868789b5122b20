"""Which engine generates the rollouts: a typed choice (``rollout.engine.kind``), each kind with its own fields.

``local`` is the embedded engine (:mod:`harmonyrl.engine.local`), the laptop default; ``vllm`` is a client of a
vLLM server spoken to over HTTP in token ids (:mod:`harmonyrl.engine.vllm`). Both are built in one place,
``harmonyrl.run.setup.make_engine``; the rest of the code sees only the ``Engine`` protocol.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from harmonyrl.frozen import Frozen


class LocalEngineConfig(Frozen):
    """The embedded engine: continuous batching and a KV cache in the trainer's process."""

    kind: Literal["local"] = "local"
    max_batch: int = Field(128, ge=1)
    """Engine slots: how many sequences decode together."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Precision of the embedded engine (the trainer stays fp32); the gap shows in ``mismatch/*``."""
    kernel: Literal["auto", "native", "torch"] = "auto"
    """Decode step: the compiled C step (native: fp32 only, built at install), eager torch (torch), or native
    where it can run and torch elsewhere (auto)."""
    prefix_cache_mib: float = Field(256.0, ge=0, allow_inf_nan=False)
    """Memory for cached prompt prefixes: environments' shared heads and finished turns, so an agent's next turn
    prefills only the tool result (least recently used dropped first; 0 turns caching off)."""

    @property
    def concurrency(self) -> int:
        """How many generations the rollout keeps in flight."""
        return self.max_batch


class VllmEngineConfig(Frozen):
    """A vLLM server (OpenAI-compatible, started by the user) spoken to in token ids; docs/vllm.md."""

    kind: Literal["vllm"] = "vllm"
    url: str = "http://127.0.0.1:8000"
    """Base URL of the server (``vllm serve ... --host --port``)."""
    model: str = Field(min_length=1)
    """The served model name (``--served-model-name``); checked against ``/v1/models`` before any work."""
    route: Literal["generate", "completions"] = "generate"
    """Token-in/token-out ``/inference/v1/generate`` (needs ``--enable-scale-out``), or ``/v1/completions`` with a
    token-id prompt and ``return_token_ids``."""
    max_concurrency: int = Field(64, ge=1)
    """Generations in flight at once (the server batches them)."""
    connect_timeout_s: float = Field(10.0, gt=0)
    """Seconds to open a connection before the attempt counts as failed."""
    request_timeout_s: float = Field(600.0, gt=0)
    """Seconds one generation (or weight reload) may take before the attempt counts as failed."""
    retries: int = Field(4, ge=0, le=20)
    """Further attempts after a connection error, timeout or 5xx; then the step fails loudly."""
    backoff_s: float = Field(0.5, gt=0)
    """First wait between attempts; doubled each retry, capped at 30 s."""
    restart_wait_s: float = Field(120.0, ge=0)
    """How long a request waits for a server that refuses or drops connections (down, or restarting) before the
    step fails and the run stops with one line; a restarted server is sent the current weights again before any
    of its samples is kept."""
    weight_sync: Literal["reload", "none"] = "reload"
    """After each update: save the weights to ``sync_dir`` and have the server reload them (``reload``, needs
    ``VLLM_SERVER_DEV_MODE=1`` for ``/collective_rpc``), or leave the server's weights alone (``none``: the
    rollouts stay on the starting policy; for evaluation only)."""
    sync_dir: str | None = None
    """Folder the server can read where the first sync's weights are saved, every tensor (default:
    ``<run>/vllm_weights``): a restarted server is loaded from it, then from the last update."""
    update_dir: str | None = None
    """Folder of each later sync's file, only what trained (LoRA: the adapted layers, merged; full fine-tuning:
    everything), overwritten each step (default: a memory-backed folder in ``/dev/shm`` when the machine has
    one, else ``sync_dir``). The server must be able to read it: same machine, or a shared mount."""
    sync_dtype: Literal["bfloat16", "float32"] = "bfloat16"
    """Dtype the synced weights are sent in (the server casts them to its own): bf16 halves the bytes of the
    trainer's fp32; ``float32`` for an fp32 server that must hold the trainer's weights exactly."""

    @property
    def concurrency(self) -> int:
        """How many generations the rollout keeps in flight."""
        return self.max_concurrency


EngineConfig = Annotated[LocalEngineConfig | VllmEngineConfig, Field(discriminator="kind")]
"""``rollout.engine``: the embedded engine (default) or a vLLM server."""
