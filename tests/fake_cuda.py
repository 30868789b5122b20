"""A fake ``cuda`` device on a CPU-only torch that fails on every op mixing devices (tests only).

Why: nothing here has a GPU, and CI never will, yet the GPU path must not create a tensor on one device and use it
on another (ARCHITECTURE.md §1). Real CUDA refuses such ops, CPU torch cannot see them (everything is on the CPU),
and the ``meta`` device computes nothing. This harness gives CPU torch a device that says ``cuda:0`` and computes
for real:

* :class:`FakeCudaTensor`, a wrapper subclass whose metadata says ``cuda:0`` and which holds a real CPU tensor
  (``inner``). Its ops run on the inner tensors and rewrap the results, so values, views, in-place ops and
  autograd behave as on the CPU, bit for bit.
* :class:`FakeCudaMode`, a dispatch mode that makes the factories place tensors there (``torch.zeros(...,
  device="cuda")``, ``module.to("cuda")``, ``torch.tensor(..., device=...)``) and ``.cpu()`` / ``.to("cpu")``
  unwrap them, and that checks **every** op's devices as real CUDA does: a cuda tensor beside a CPU tensor is a
  :class:`DeviceMixError` naming the op and the line of harmonyrl that called it. Allowed, as on a GPU: a 0-dim
  CPU tensor beside cuda ones (a CPU scalar), ``copy_`` across devices, and CPU index tensors in advanced
  indexing of a cuda tensor (``x[idx]``, ``x[idx] = v``).
* ``fake_cuda_guard.cpp``: a device guard and CUDA hooks that do nothing, without which autograd aborts on a
  cuda tensor in a CPU-only build. torch reads its CUDA hooks once, when it is imported, so :func:`install` must
  run *before* ``import torch``: the checks run in a child process (``tests/fake_cuda_checks.py``).
* ``torch.cuda``'s Python functions the product calls (``is_available``, ``device_count``, the RNG state, memory
  figures, ``synchronize``) are replaced by stand-ins for the child process's lifetime; the CUDA RNG state is a
  byte tensor the stand-ins keep, so a checkpoint can save and restore it.

``torch.save`` writes a fake tensor as its CPU copy (what a real checkpoint read with ``map_location="cpu"``
gives back), since a wrapper without storage cannot be pickled.

Limits: the kernels are the CPU's, so this proves placement, not CUDA numerics or speed; code that branches on
``device.type == "cuda"`` takes its CUDA branch with CPU kernels (``CUDA_ONLY_KERNELS`` emulates the one that
needs it); streams, events and the CUDA RNG are stand-ins (the RNG state is a constant the checkpoint carries);
NCCL cannot be faked, so the backend-per-device choice is checked by name only.
"""

from __future__ import annotations

import copy
import ctypes
import hashlib
import inspect
import os
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

GUARD_SOURCE = Path(__file__).with_name("fake_cuda_guard.cpp")
_lib: ctypes.CDLL | None = None
CUDA: Any = None
"""``torch.device("cuda", 0)``, once :func:`install` has run (as are the two classes below)."""
FakeCudaTensor: Any = None
FakeCudaMode: Any = None


class DeviceMixError(RuntimeError):
    """An op mixed a (fake) cuda tensor with a CPU tensor that is not a scalar."""


def _torch_dir() -> Path:
    """torch's install folder, found without importing it (its hooks must not be read yet)."""
    for base in (sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *sys.path):
        candidate = Path(base) / "torch"
        if (candidate / "lib" / "libtorch_cpu.so").is_file():
            return candidate
    raise RuntimeError("cannot find torch's libraries (torch/lib/libtorch_cpu.so) on sys.path")


def _build_guard() -> Path:
    """Compile ``fake_cuda_guard.cpp`` against this torch (cached by source and torch build; ~2 s when not)."""
    torch_dir = _torch_dir()
    built = (torch_dir / "lib" / "libtorch_cpu.so").stat().st_mtime
    key = hashlib.sha256(GUARD_SOURCE.read_bytes() + f"{torch_dir}{built}".encode()).hexdigest()[:16]
    out = Path(tempfile.gettempdir()) / f"harmonyrl-fake-cuda-{key}.so"
    if not out.is_file():
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        lib = torch_dir / "lib"
        cmd = ["g++", "-std=c++20", "-O1", "-shared", "-fPIC", "-w", f"-I{torch_dir / 'include'}",
               str(GUARD_SOURCE), f"-L{lib}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{lib}", "-o", str(tmp)]  # fmt: skip
        subprocess.run(cmd, check=True, capture_output=True)
        os.replace(tmp, out)
    return out


def install() -> None:
    """Load the native guard and hooks (before ``import torch``), then turn the fake device on for good."""
    global _lib
    if _lib is not None:
        return
    if "torch" in sys.modules:
        raise RuntimeError("fake_cuda.install() must run before torch is imported (torch reads its CUDA hooks once)")
    _lib = ctypes.CDLL(str(_build_guard()), mode=ctypes.RTLD_GLOBAL)
    _lib.fake_cuda_enable(1)
    import torch

    assert _lib.fake_cuda_live() == 1, "torch did not take the fake CUDA hooks"
    global CUDA, FakeCudaTensor, FakeCudaMode
    CUDA, FakeCudaTensor, FakeCudaMode = torch.device("cuda", 0), _tensor_class(), _mode_class()
    # backward on the calling thread, where the mode is in force (not on a per-device worker thread)
    torch.autograd.set_multithreading_enabled(False).__enter__()
    _patch_torch_cuda(torch)
    _patch_save(torch)
    _patch_tensor_constructors(torch)


# ---- the tensor -----------------------------------------------------------------------------------------------


def _tensor_class() -> type[torch.Tensor]:
    import torch

    class FakeCudaTensor(torch.Tensor):
        """Says ``cuda:0``; holds its values in ``inner``, a real CPU tensor of the same shape, strides and dtype."""

        inner: torch.Tensor

        @staticmethod
        def __new__(cls, inner: torch.Tensor) -> FakeCudaTensor:
            r = torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined]
                cls, inner.size(), strides=inner.stride(), storage_offset=inner.storage_offset(),
                dtype=inner.dtype, layout=inner.layout, device=CUDA, requires_grad=False,
            )  # fmt: skip
            r.inner = inner
            return r  # type: ignore[no-any-return]

        def __repr__(self, *, tensor_contents: Any = None) -> str:
            return f"FakeCuda({self.inner!r})"

        # torch turns a list index into a tensor on the indexed tensor's device below the dispatch modes, where
        # the fake device has no kernels: make it a CPU index tensor first (CUDA accepts those)
        def __getitem__(self, index: Any) -> Any:
            return super().__getitem__(_host_lists(index))

        def __setitem__(self, index: Any, value: Any) -> None:
            super().__setitem__(_host_lists(index), value)

        def untyped_storage(self) -> Any:  # (the storage identity transformers and safetensors compare)
            return self.inner.untyped_storage()

        def __deepcopy__(self, memo: dict[int, Any]) -> Any:  # a fresh inner copy, as on a GPU (model copies)
            if id(self) in memo:
                return memo[id(self)]
            new = FakeCudaTensor(self.inner.detach().clone()).requires_grad_(self.requires_grad)
            memo[id(self)] = new
            if self.grad is not None:
                new.grad = copy.deepcopy(self.grad, memo)
            for key, value in vars(self).items():  # ``_is_param`` and the like
                if key != "inner":
                    setattr(new, key, copy.deepcopy(value, memo))
            return new

        def tolist(self) -> Any:  # (refused for subclasses by torch; on a GPU it copies to the host)
            return self.inner.tolist()

        def __tensor_flatten__(self) -> tuple[list[str], None]:  # a traceable wrapper: module.to() swaps it in
            return ["inner"], None

        @staticmethod
        def __tensor_unflatten__(inner: dict[str, torch.Tensor], meta: None, size: Any, stride: Any) -> Any:
            return FakeCudaTensor(inner["inner"])

        def __reduce_ex__(self, proto: Any) -> Any:  # deepcopy / pickle: its CPU values, back on the fake device
            return (_rewrap, (self.inner.detach().clone(), self.requires_grad))

        @classmethod
        def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            return _run(func, args, kwargs or {})

    return FakeCudaTensor


def _host_lists(index: Any) -> Any:
    import torch

    if isinstance(index, list):
        return torch.tensor(index)
    if isinstance(index, tuple):
        return tuple(torch.tensor(i) if isinstance(i, list) else i for i in index)
    return index


def _rewrap(inner: torch.Tensor, requires_grad: bool) -> torch.Tensor:
    return FakeCudaTensor(inner).requires_grad_(requires_grad)


# ---- the op runner: unwrap, check, run on the CPU, rewrap ------------------------------------------------------

CROSS_DEVICE_OK = {"aten.copy_.default", "aten._to_copy.default", "aten.lift_fresh.default",
                   "aten.lift_fresh_copy.default", "aten._copy_from.default", "aten._copy_from_and_resize.default",
                   "aten._has_compatible_shallow_copy_type.default", "aten.set_.source_Tensor"}  # fmt: skip
"""Ops that move data between devices by design (as on a real GPU)."""
INDEX_OPS = {"aten.index.Tensor", "aten.index_put_.default", "aten.index_put.default", "aten._index_put_impl_.default"}
"""Advanced indexing: CUDA accepts CPU index tensors for a cuda ``self`` (it copies them over)."""


def _histc(x: Any, bins: int = 100, min: float = 0, max: float = 0) -> Any:
    return x.histc(bins, min, max) if x.is_floating_point() else x.float().histc(bins, min, max).to(x.dtype)


CUDA_ONLY_KERNELS: dict[str, Callable[..., Any]] = {"aten.histc.default": _histc}
"""Kernels CUDA has and CPU lacks, emulated on the inner CPU tensors (transformers' grouped experts take
``histc`` of int expert ids on CUDA, of floats on the CPU)."""


def _is_cuda(device: Any) -> bool:
    import torch

    return device is not None and torch.device(device).type == "cuda"


def _caller() -> str:
    """The innermost harmonyrl (or test) line that led to the op, for the error message."""
    here = Path(__file__).resolve()
    for frame in inspect.stack()[2:]:
        path = Path(frame.filename)
        if "harmonyrl" in path.parts and "site-packages" not in path.parts and path.resolve() != here:
            return f"{path.name}:{frame.lineno} in {frame.function}: {(frame.code_context or [''])[0].strip()}"
    for frame in inspect.stack()[2:]:
        if Path(frame.filename).resolve() != here and "torch" not in Path(frame.filename).parts:
            return f"{Path(frame.filename).name}:{frame.lineno} in {frame.function}"
    return "?"


def _check(name: str, args: Any, kwargs: Any) -> None:
    """Refuse what real CUDA refuses: a cuda tensor beside a non-scalar CPU tensor."""
    import torch
    from torch.utils._pytree import tree_leaves

    if name in CROSS_DEVICE_OK:
        return
    leaves = [x for x in tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
    fakes = [x for x in leaves if isinstance(x, FakeCudaTensor)]
    if not fakes:
        return
    cpu = [x for x in leaves if not isinstance(x, FakeCudaTensor) and x.device.type == "cpu" and x.dim() > 0]
    if name in INDEX_OPS:
        self_ = args[0]
        if not isinstance(self_, FakeCudaTensor):  # a CPU tensor indexed by cuda indices: refused on a GPU too
            raise DeviceMixError(f"{name}: CPU tensor {tuple(self_.shape)} indexed by cuda tensors at {_caller()}")
        indices = args[1] if len(args) > 1 else []
        cpu = [x for x in cpu if not any(x is i for i in indices if i is not None)]
    if cpu:
        shapes = ", ".join(str(tuple(x.shape)) for x in cpu)
        raise DeviceMixError(f"{name}: cuda tensor beside CPU tensor(s) {shapes} at {_caller()}")


def _run(func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    import torch
    from torch.utils._pytree import tree_map

    name = str(func)
    _check(name, args, kwargs)
    any_fake = any(isinstance(x, FakeCudaTensor) for x in torch.utils._pytree.tree_leaves((args, kwargs)))
    on_cuda = any_fake
    if "device" in kwargs:  # a factory or a move: the device asked for decides
        on_cuda = _is_cuda(kwargs["device"])
        kwargs = {**kwargs, "device": torch.device("cpu")} if on_cuda else kwargs
    elif any(isinstance(a, torch.device) for a in args):  # (aten.to.device, as inference mode dispatches it)
        on_cuda = any(_is_cuda(a) for a in args if isinstance(a, torch.device))
        args = tuple(torch.device("cpu") if isinstance(a, torch.device) else a for a in args)
    inputs = {}

    def unwrap(x: Any) -> Any:
        if isinstance(x, FakeCudaTensor):
            inputs[id(x.inner)] = x
            return x.inner
        return x

    u_args, u_kwargs = tree_map(unwrap, args), tree_map(unwrap, kwargs)
    if name in ("aten.copy_.default", "aten._copy_from.default") and isinstance(args[0], FakeCudaTensor):
        on_cuda = True
    try:
        out = (CUDA_ONLY_KERNELS.get(name, func) if any_fake else func)(*u_args, **u_kwargs)
    except NotImplementedError as e:  # say which op: torch's message names only the kernel it missed
        raise NotImplementedError(f"{name} with {[type(a).__name__ for a in u_args]} {u_kwargs}: {e}") from e
    if not on_cuda:
        return out

    def wrap(x: Any) -> Any:
        if not isinstance(x, torch.Tensor) or isinstance(x, FakeCudaTensor):
            return x
        if id(x) in inputs:  # an in-place op (or out=) returns its input: the same wrapper
            return inputs[id(x)]
        return FakeCudaTensor(x)

    # a view of a normal tensor is a normal tensor, even in inference mode (autograd then shares its version)
    normal_view = (
        func.is_view and torch.is_inference_mode_enabled() and any(not v.is_inference() for v in inputs.values())
    )
    with torch.inference_mode(False) if normal_view else nullcontext():
        return tree_map(wrap, out)


def _mode_class() -> type[Any]:
    from torch.utils._python_dispatch import TorchDispatchMode

    class FakeCudaMode(TorchDispatchMode):
        """Places factory results on the fake device when asked for ``cuda`` and checks every op's devices."""

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            return _run(func, args, kwargs or {})

    return FakeCudaMode


@contextmanager
def fake_cuda() -> Iterator[None]:
    """Inside: ``device="cuda"`` places tensors on the fake device, and any op that mixes devices raises."""
    install()
    with FakeCudaMode():
        yield


# ---- torch.cuda's Python side, and torch.save ----------------------------------------------------------------

_RNG_STATE: dict[str, Any] = {}


def _patch_torch_cuda(torch: Any) -> None:
    """Stand-ins for the ``torch.cuda`` functions a CPU build cannot answer."""
    cuda = torch.cuda
    rng = torch.Generator().manual_seed(1234)
    _RNG_STATE["state"] = rng.get_state()  # a byte tensor, as torch.cuda.get_rng_state returns

    def get_rng_state(device: Any = "cuda") -> torch.Tensor:
        return _RNG_STATE["state"].clone()  # type: ignore[no-any-return]

    def set_rng_state(new_state: torch.Tensor, device: Any = "cuda") -> None:
        if not isinstance(new_state, torch.Tensor) or new_state.dtype != torch.uint8 or new_state.device.type != "cpu":
            raise TypeError("torch.cuda.set_rng_state expects a CPU torch.ByteTensor")
        _RNG_STATE["state"] = new_state.clone()

    patches: dict[str, Callable[..., Any]] = {
        "is_available": lambda: True,
        "device_count": lambda: 1,
        "current_device": lambda: 0,
        "set_device": lambda device: None,
        "synchronize": lambda device=None: None,
        "_lazy_init": lambda: None,
        "is_initialized": lambda: True,
        "get_rng_state": get_rng_state,
        "set_rng_state": set_rng_state,
        "get_rng_state_all": lambda: [get_rng_state()],
        "set_rng_state_all": lambda states: [set_rng_state(s) for s in states] and None,
        "manual_seed": lambda seed: None,
        "manual_seed_all": lambda seed: None,
        "empty_cache": lambda: None,
        "memory_allocated": lambda device=None: 0,
        "max_memory_allocated": lambda device=None: 0,
        "memory_reserved": lambda device=None: 0,
        "max_memory_reserved": lambda device=None: 0,
        "reset_peak_memory_stats": lambda device=None: None,
        "mem_get_info": lambda device=None: (140 * 2**30, 141 * 2**30),
        "is_bf16_supported": lambda including_emulation=True: True,
        "get_device_capability": lambda device=None: (9, 0),  # an H200
        "get_device_name": lambda device=None: "fake cuda (CPU)",
    }
    for attr, fn in patches.items():
        setattr(cuda, attr, fn)
    torch.cuda.random.get_rng_state_all = patches["get_rng_state_all"]
    torch.cuda.random.set_rng_state_all = patches["set_rng_state_all"]


def _to_host(obj: Any) -> Any:
    """``obj`` (a checkpoint's nested dicts, lists and tuples) with every fake tensor replaced by its CPU copy."""
    if isinstance(obj, FakeCudaTensor):
        return obj.inner.detach().clone()
    if isinstance(obj, dict):
        return type(obj)((k, _to_host(v)) for k, v in obj.items())  # (OrderedDict too: state dicts)
    if isinstance(obj, list):
        return [_to_host(v) for v in obj]
    if type(obj) is tuple:
        return tuple(_to_host(v) for v in obj)
    return obj


def _patch_tensor_constructors(torch: Any) -> None:
    """``torch.tensor(data, device="cuda")`` builds its tensor below the dispatch modes, so it could not reach
    the fake device: build it on the CPU and move it there (through the mode, like any ``.to``)."""
    for name in ("tensor", "as_tensor"):
        original = getattr(torch, name)

        def build(data: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            device = kwargs.get("device")
            if not _is_cuda(device):
                return _original(data, *args, **kwargs)
            host = _original(data, *args, **{**kwargs, "device": "cpu"})
            return host.to(device)

        setattr(torch, name, build)


def _patch_save(torch: Any) -> None:
    original = torch.save

    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        original(_to_host(obj), f, *args, **kwargs)

    torch.save = save
