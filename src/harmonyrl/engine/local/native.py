"""The compiled decode step (``engine/csrc/decode.c``), bound with ctypes.

:class:`NativeDecode` owns input-major copies of one :class:`~harmonyrl.engine.local.forward.LeanForward`'s weights
(``[in, out]`` in 16-column panels, what the C GEMMs read; the experts' gate/up columns de-interleaved) and the C
structs that point at them and at the engine's KV cache (per layer, with its capacity: a sliding layer's ring holds
its window only); :meth:`NativeDecode.refresh` rebuilds both after a weight sync. A step is one C call: no Python
per layer. The panels are a second full copy of the weights (:attr:`NativeDecode.nbytes`); that is the price of
the C step's speed on a CPU, where the engine runs in fp32 beside an fp32 trainer; a GPU engine has no panels.

When it applies (:func:`native_unsupported` says why not otherwise): the extension was built (``pip install``
compiles it; ``optional``, so a machine without a C compiler installs harmonyrl anyway), the engine runs in
fp32, head_dim is 8, 16, 32 or 64 and there are at most 64 experts. Otherwise the engine decodes with eager
torch, the reference this step is tested against (``tests/engine/test_native.py``). :func:`use_native` turns
``rollout.engine.kernel`` into a decision, or a one-line error where ``native`` cannot run.

The extension also computes the sampler's Gumbel uniforms (:func:`gumbel_uniform`, ``csrc/sample.c``) for
either kernel: the same bits as the torch reference, so it changes no sampled token, only the time.
"""

from __future__ import annotations

import ctypes
import importlib.util
from functools import cache
from typing import TYPE_CHECKING, Literal

import torch
import torch.nn.functional as F

from harmonyrl.errors import KernelUnavailable
from harmonyrl.models.moe_routing import NOT_ROUTED
from harmonyrl.threads import adapt

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from harmonyrl.engine.local.forward import LeanForward
    from harmonyrl.engine.local.forward import _Layer as _Spec

KernelChoice = Literal["auto", "native", "torch"]
"""The engine's decode step: compiled, eager torch, or compiled where it can run (``rollout.engine.kernel``)."""

_F = ctypes.POINTER(ctypes.c_float)
_I = ctypes.POINTER(ctypes.c_int64)


class _Layer(ctypes.Structure):
    _fields_ = [
        *((name, _F) for name in ("norm_w", "post_w", "qkv_w", "qkv_b", "o_w", "o_b", "sinks", "router_w")),
        *((name, _F) for name in ("router_b", "w1", "b1", "w2", "b2", "k_cache", "v_cache")),
        ("window", ctypes.c_int64),
        ("cap", ctypes.c_int64),
    ]


class _Model(ctypes.Structure):
    _fields_ = [
        *((name, ctypes.c_int64) for name in ("hidden", "heads", "kv_heads", "head_dim", "experts", "top_k")),
        *((name, ctypes.c_int64) for name in ("inter", "vocab", "layers", "max_seq")),
        *((name, ctypes.c_double) for name in ("eps", "alpha", "limit")),
        *((name, _F) for name in ("embed", "final_w", "lm_w", "cos2", "sin2")),
        ("layer", ctypes.POINTER(_Layer)),
    ]


@cache
def library() -> ctypes.CDLL | None:
    """The compiled extension, or None if this install has none (built without a C compiler)."""
    spec = importlib.util.find_spec("harmonyrl.engine.local._decode")
    if spec is None or spec.origin is None:
        return None
    lib = ctypes.CDLL(spec.origin)
    lib.hrl_decode.argtypes = [ctypes.POINTER(_Model), ctypes.c_int64, _I, _I, _I, _I, _F, _I, ctypes.c_int64]
    lib.hrl_decode.restype = ctypes.c_int
    lib.hrl_isa.restype = ctypes.c_char_p
    lib.hrl_gumbel_uniform.argtypes = [_I, _I, ctypes.c_int64, ctypes.c_int64, _F, ctypes.c_int64]
    lib.hrl_gumbel_uniform.restype = None
    return lib


def isa() -> str | None:
    """Which build of the math this CPU runs (``avx2`` or ``generic``), or None without the extension."""
    lib = library()
    return None if lib is None else lib.hrl_isa().decode()


def native_unsupported(config: PretrainedConfig, dtype: torch.dtype) -> str | None:
    """Why the compiled step cannot serve an engine for a model of ``config`` in ``dtype``, or None if it can."""
    if library() is None:
        return "the C extension harmonyrl.engine.local._decode was not built (no C compiler at install time?)"
    if dtype != torch.float32:
        return f"it computes in float32 only, the engine runs in {dtype}"
    if config.head_dim not in (8, 16, 32, 64):
        return f"head_dim must be 8, 16, 32 or 64 (gpt-oss: 64), got {config.head_dim}"
    if config.num_local_experts > 64:
        return f"at most 64 experts, got {config.num_local_experts}"
    return None


def use_native(kernel: KernelChoice, config: PretrainedConfig, dtype: torch.dtype) -> bool:
    """Whether an engine asked for ``kernel`` runs the compiled step (``auto``: wherever it can). Raises
    :class:`~harmonyrl.errors.KernelUnavailable` if ``native`` was asked for where it cannot run."""
    if kernel not in ("auto", "native", "torch"):
        raise ValueError(f"kernel must be 'auto', 'native' or 'torch', got {kernel!r}")
    if kernel == "torch":
        return False
    why = native_unsupported(config, dtype)
    if why is not None and kernel == "native":
        raise KernelUnavailable(f"rollout.engine.kernel=native cannot run here: {why}")
    return why is None


PANEL = 16
"""Columns per weight panel (``PANEL`` in decode.c)."""


def pack(w: torch.Tensor) -> torch.Tensor:
    """Input-major weights ``[..., K, N]`` → panels ``[..., ceil(N / 16), K, 16]``, zero-padded: what decode.c's
    GEMM streams (16 output columns for every input, contiguous)."""
    *lead, k, n = w.shape
    padded = F.pad(w, (0, -n % PANEL))
    return padded.view(*lead, k, -1, PANEL).transpose(-3, -2).contiguous()


def _f(t: torch.Tensor | None) -> ctypes._Pointer[ctypes.c_float] | None:
    if t is None:
        return None
    assert t.dtype == torch.float32 and t.is_contiguous()
    return ctypes.cast(t.data_ptr(), _F)


def _i(t: torch.Tensor) -> ctypes._Pointer[ctypes.c_int64]:
    assert t.dtype == torch.int64 and t.is_contiguous()
    return ctypes.cast(t.data_ptr(), _I)


def gumbel_uniform(keys: torch.Tensor, counters: torch.Tensor, vocab_size: int) -> torch.Tensor | None:
    """The uniforms ``u`` ``[B, V]`` of :func:`harmonyrl.engine.local.sampling.gumbel_noise`, bit for bit, computed in
    C (``csrc/sample.c``) from int64 ``keys`` and ``counters`` ``[B]``; None without the extension."""
    lib = library()
    if lib is None:
        return None
    keys, counters = keys.to(torch.int64).contiguous(), counters.to(torch.int64).contiguous()
    u = torch.empty(keys.shape[0], vocab_size)
    lib.hrl_gumbel_uniform(_i(keys), _i(counters), keys.shape[0], vocab_size, _f(u), adapt())
    return u


class NativeDecode:
    """One fused decode step over ``fwd``'s weights and KV cache (see module docstring)."""

    def __init__(self, fwd: LeanForward) -> None:
        lib = library()
        assert lib is not None, "check native_unsupported() first"
        self._lib = lib
        self._fwd = fwd
        self._keep: list[torch.Tensor] = []  # every tensor the structs point into
        self._model = _Model()
        self._layers = (_Layer * len(fwd.layers))()
        self.refresh()

    def refresh(self) -> None:
        """Re-read the weights (after ``LeanForward.refresh``): input-major copies, fresh pointers."""
        fwd, cfg = self._fwd, self._fwd.model.config
        keep: list[torch.Tensor] = []

        def own(t: torch.Tensor | None) -> ctypes._Pointer[ctypes.c_float] | None:
            if t is None:
                return None
            t = t.detach().float().contiguous()
            keep.append(t)
            return _f(t)

        def weight(w: torch.Tensor) -> ctypes._Pointer[ctypes.c_float] | None:
            return own(pack(w.detach().float()))

        def qkv(spec: _Spec) -> torch.Tensor:
            return spec.qkv_w if spec.qkv_w is not None else torch.cat([w for w, _ in spec.proj])

        def bias(b: torch.Tensor | None) -> ctypes._Pointer[ctypes.c_float] | None:
            return None if b is None else own(F.pad(b.detach().float(), (0, -b.shape[-1] % PANEL)))

        for i, (spec, hf) in enumerate(zip(fwd.specs, fwd.layers, strict=True)):
            experts, router = spec.mlp.experts, spec.mlp.router
            layer = self._layers[i]
            layer.norm_w, layer.post_w = own(spec.norm_w), own(spec.post_w)
            layer.qkv_w, layer.qkv_b = weight(qkv(spec).t()), bias(spec.qkv_b)
            layer.o_w, layer.o_b = weight(spec.o_w.t()), bias(spec.o_b)
            layer.sinks = own(spec.sinks)
            layer.router_w, layer.router_b = weight(router.weight.t()), bias(router.bias)
            two_i = experts.gate_up_proj.shape[2]  # HF interleaves gate (even) and up (odd) columns; C wants halves
            order = torch.cat([torch.arange(0, two_i, 2), torch.arange(1, two_i, 2)]).to(experts.gate_up_proj.device)
            layer.w1 = weight(experts.gate_up_proj.detach()[:, :, order])
            layer.b1 = bias(experts.gate_up_proj_bias.detach()[:, order])
            layer.w2, layer.b2 = weight(experts.down_proj), bias(experts.down_proj_bias)
            layer.k_cache, layer.v_cache = _f(fwd.cache.k[i]), _f(fwd.cache.v[i])
            layer.window = fwd.window if spec.sliding else 0
            layer.cap = fwd.cache.caps[i]
            assert hf.mlp is spec.mlp
        probe = fwd.model.lm_head.weight
        cos2, sin2 = fwd.rope_table(probe)
        m, experts = self._model, fwd.specs[0].mlp.experts
        m.hidden, m.heads, m.kv_heads, m.head_dim = cfg.hidden_size, fwd.heads, fwd.kv_heads, fwd.head_dim
        m.experts, m.top_k, m.inter = cfg.num_local_experts, cfg.num_experts_per_tok, experts.down_proj.shape[1]
        m.vocab, m.layers, m.max_seq = cfg.vocab_size, len(fwd.layers), fwd.cache.max_seq_len
        (final_w, eps), alpha, limit = fwd.final_norm, float(experts.alpha), float(experts.limit)
        m.eps, m.alpha, m.limit = eps, alpha, limit
        m.embed, m.final_w = own(fwd.model.model.embed_tokens.weight), own(final_w)
        m.lm_w, m.cos2, m.sin2 = weight(fwd.model.lm_head.weight.t()), own(cos2), own(sin2)
        m.layer = self._layers
        self._keep = keep

    @property
    def tensors(self) -> list[torch.Tensor]:
        """What the C structs point into besides the KV cache: the panels, and fp32 norms, sinks and tables (some
        of which are the forward's own tensors: count storages)."""
        return self._keep

    def __call__(
        self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, record: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """ids, positions, slots ``[B]`` (int64) → fp32 logits ``[B, V]`` and, if ``record``, the experts chosen
        ``[B, L, k]`` (int64); each row's key and value go into its slot at its position first."""
        return self._step(tokens, positions, slots, None, tokens.shape[0], record)

    def prefill(
        self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, last: torch.Tensor, record: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Prompts fed token by token: ``[N]`` ids, positions and slots, each slot's rows contiguous and in position
        order (its cache already holds the positions before them); ``last`` ``[P]``: the row of each prompt whose
        logits are wanted → logits ``[P, V]`` and, if ``record``, the experts of every row ``[N, L, k]`` (the last
        layer's only for the ``last`` rows: the others stop after writing their keys and values there, as the eager
        prefill does).

        Every row runs the decode step's own arithmetic, so its keys, values and logits are the same bits whatever
        other prompts share the call, however a prompt is split between a cached prefix and this call, and on
        however many threads: the engine's log-probs never depend on batch composition (timing)."""
        emit = torch.full((tokens.shape[0],), -1, dtype=torch.int64)
        emit[last] = torch.arange(last.shape[0])
        return self._step(tokens, positions, slots, emit, last.shape[0], record)

    def _step(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        emit: torch.Tensor | None,
        n_out: int,
        record: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        b, m = tokens.shape[0], self._model
        logits = torch.empty(n_out, m.vocab)
        routing = None
        if record:  # a prefill's rows whose logits are not wanted stop after the last layer's keys: not routed there
            routing = (
                torch.empty(b, m.layers, m.top_k, dtype=torch.int64)
                if emit is None
                else torch.full((b, m.layers, m.top_k), NOT_ROUTED, dtype=torch.int64)
            )
        status = self._lib.hrl_decode(
            ctypes.byref(m),
            b,
            _i(tokens),
            _i(positions),
            _i(slots),
            None if emit is None else _i(emit),
            _f(logits),
            None if routing is None else _i(routing),
            adapt(),  # the free cores now: a thread without a core would hold up the whole step
        )
        if status != 0:
            raise MemoryError("the C decode step could not allocate its buffers")
        return logits, routing
