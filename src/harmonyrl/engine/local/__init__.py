"""The embedded engine: continuous batching, KV cache, prefix cache and batch-invariant sampling in the trainer's
process, with an optional compiled decode step (``csrc/``). The laptop default behind the ``Engine`` protocol."""

from harmonyrl.engine.local.engine import LocalEngine

__all__ = ["LocalEngine"]
