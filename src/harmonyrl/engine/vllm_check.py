"""Before any work: is the configured vLLM server there, serving this model, with the routes the client needs?

Each problem is one :class:`~harmonyrl.errors.EngineUnavailable` line naming the key to change or the server flag
to add. Checked: the server answers ``/v1/models``; it serves ``rollout.engine.model`` with a context of at least
``rollout.max_seq_len``; the model folder it loaded (when this machine can read it) has this model's shape
(vocab, width, layers, experts); the generation route and, for ``weight_sync=reload``, the dev-mode routes exist
and the server runs harmonyrl's worker extension at this client's protocol (without it a sync would reload all
but the MoE experts and the attention sinks: a silently off-policy run).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harmonyrl.engine.config import VllmEngineConfig
from harmonyrl.engine.vllm import ROUTES, load_httpx
from harmonyrl.engine.vllm_worker import EXTENSION_CLS, SYNC_PROTOCOL
from harmonyrl.errors import EngineUnavailable

SHAPE_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_local_experts", "num_attention_heads")
"""Config fields that must match between the trainer's model and the served one for a weight sync to fit."""
SYNC_ROUTES = ("/pause", "/resume", "/collective_rpc", "/update_weight_version")


def check_server(config: VllmEngineConfig, model_config: Any | None, max_seq_len: int) -> str:
    """Raise :class:`EngineUnavailable` (one line) unless the server can serve this run; else a header label.
    ``model_config`` None: any model shape (a judge's server, whose model is not the policy's)."""
    httpx = load_httpx()
    url = config.url
    try:
        with httpx.Client(base_url=url, timeout=httpx.Timeout(config.connect_timeout_s)) as client:
            models = client.get("/v1/models")
            paths = set(client.get("/openapi.json").json().get("paths", {}))
            version = client.get("/version").json().get("version", "?")
    except (httpx.HTTPError, json.JSONDecodeError, AttributeError) as e:
        raise EngineUnavailable(f"rollout.engine.url={url}: no vLLM server answers there ({e})") from None
    served = {m.get("id"): m for m in models.json().get("data", [])} if models.status_code == 200 else {}
    if config.model not in served:
        raise EngineUnavailable(
            f"the vLLM server at {url} serves {sorted(served) or 'no model'}, not rollout.engine.model={config.model!r}"
        )
    entry = served[config.model]
    if int(entry.get("max_model_len") or 0) < max_seq_len:
        raise EngineUnavailable(
            f"the vLLM server's max_model_len={entry.get('max_model_len')} is below rollout.max_seq_len={max_seq_len}"
            " (restart it with --max-model-len, or lower rollout.max_seq_len)"
        )
    _check_shape(entry.get("root"), model_config, url)
    if ROUTES[config.route] not in paths:
        raise EngineUnavailable(
            f"the vLLM server at {url} has no {ROUTES[config.route]}: start it with --enable-scale-out "
            "or set rollout.engine.route=completions"
        )
    if config.weight_sync == "reload" and (missing := [p for p in SYNC_ROUTES if p not in paths]):
        raise EngineUnavailable(
            f"the vLLM server at {url} has no {', '.join(missing)}: start it with VLLM_SERVER_DEV_MODE=1 "
            "for rollout.engine.weight_sync=reload"
        )
    if config.weight_sync == "reload":
        _check_extension(config)
    return f"vllm {version} at {url} ({config.model}, {config.route})"


def _check_extension(config: VllmEngineConfig) -> None:
    """The server's workers answer ``harmonyrl_sync_protocol`` with this client's :data:`SYNC_PROTOCOL`."""
    httpx = load_httpx()
    body = {"method": "harmonyrl_sync_protocol", "timeout": config.connect_timeout_s}
    try:
        with httpx.Client(base_url=config.url, timeout=httpx.Timeout(config.request_timeout_s)) as client:
            answer = client.post("/collective_rpc", json=body)
            results = answer.json().get("results") if answer.status_code == 200 else None
    except (httpx.HTTPError, json.JSONDecodeError, AttributeError):
        results = None
    if not results:
        raise EngineUnavailable(
            f"the vLLM server at {config.url} does not run harmonyrl's weight sync: start it with "
            f"--worker-extension-cls {EXTENSION_CLS} (harmonyrl importable there; docs/vllm.md)"
        )
    if any(str(r) != str(SYNC_PROTOCOL) for r in results):
        raise EngineUnavailable(
            f"the vLLM server at {config.url} runs harmonyrl's weight sync protocol {results[0]}, this client "
            f"speaks {SYNC_PROTOCOL}: install the same harmonyrl in the server's environment"
        )


def _check_shape(root: Any, model_config: Any | None, url: str) -> None:
    """When the served model's folder is readable here, its config must have this model's shape."""
    path = Path(str(root)) / "config.json" if root else None
    if model_config is None or path is None or not path.is_file():
        return  # a remote server: a weight sync of the wrong shape fails loudly on the server instead
    served = json.loads(path.read_text(encoding="utf-8"))
    wrong = [
        f"{k} {served.get(k)} != {getattr(model_config, k, None)}"
        for k in SHAPE_KEYS
        if served.get(k) != getattr(model_config, k, None)
    ]
    if wrong:
        raise EngineUnavailable(f"the vLLM server at {url} serves another model ({root}: {'; '.join(wrong)})")
