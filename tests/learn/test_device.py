"""``device=auto|cpu|cuda``: the trainer and the engine's torch decode follow the configured device.

No GPU here: the plumbing is checked on the CPU, with the ``meta`` device standing in for a GPU where the code
only places tensors (a meta tensor holds no values, so nothing can silently compute on it): the trainer's batches,
value head and reference model, the engine's model copy, KV cache and routing buffer. And every tensor the engine's
decode modules create names its device, or is marked ``# host`` (Python-side bookkeeping, the C step's CPU path).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

import harmonyrl
from harmonyrl.config import ConfigError, RLConfig, load_config
from harmonyrl.engine.local import LocalEngine
from harmonyrl.harmony.tokenizer import HarmonyTokenizer
from harmonyrl.learn.device import resolve_device
from harmonyrl.models.tiny_gpt_oss import build_config, build_model
from harmonyrl.rl.learner import Learner
from harmonyrl.rl.targets import prepare
from harmonyrl.run.setup import check_engine, make_model
from harmonyrl.types import Trajectory

SRC = Path(harmonyrl.__file__).parent
ENGINE_DECODE = ("forward.py", "engine.py", "sampling.py", "routing_capture.py", "prefix_cache.py", "moe.py")
FACTORIES = {"tensor", "as_tensor", "zeros", "ones", "empty", "full", "arange", "rand", "randn", "randint"}


def test_the_trainer_puts_its_batches_where_its_model_is() -> None:
    meta = torch.device("meta")  # stands in for a GPU: nothing can silently compute on it
    trajs = [
        Trajectory(
            f"t{i % 2}",
            i % 2,
            tuple(range(1, 30 + i)),
            (0,) * 10 + (1,) * (19 + i),
            (-1.0,) * (29 + i),
            float(i < 2),
            True,
            False,
            None,
            (),
        )
        for i in range(4)
    ]
    prepared = prepare(trajs, RLConfig(), pad_id=0, device=meta)
    assert prepared is not None
    tensors = [v for v in vars(prepared.batch).values() if isinstance(v, torch.Tensor)]
    assert len(tensors) == 6 and all(t.device == meta for t in tensors)
    model = build_model(build_config("nano", 97, 0, 1), seed=0).to(meta)
    learner = Learner.create(RLConfig(advantage={"kind": "gae"}), model, pad_id=0, norm=64.0, seed=0)
    assert learner.rule.value_head is not None and all(p.device == meta for p in learner.rule.value_head.parameters())
    assert all(p.device == meta for p in learner.reference.module.parameters())


def test_the_engine_puts_its_model_cache_and_routing_on_its_device() -> None:
    model = build_model(build_config("nano", 97, 0, 1), seed=0)
    engine = LocalEngine(model, max_batch=2, max_seq_len=64, kernel="torch", device=torch.device("meta"))
    assert engine.device.type == "meta"
    assert all(p.device.type == "meta" for p in engine._model.parameters())
    assert all(t.device.type == "meta" for t in engine._fwd.cache.k) and engine._fwd._arange.device.type == "meta"
    assert engine._routing is not None and engine._routing.buffer.device.type == "meta"
    with pytest.raises(ValueError, match="compiled CPU step"):
        LocalEngine(model, max_batch=2, max_seq_len=64, kernel="native", device=torch.device("meta"))


def _unplaced(path: Path) -> list[str]:
    """``torch.<factory>(...)`` calls without ``device=`` on a line not marked ``# host``."""
    lines = path.read_text().splitlines()
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        target = node.func.value
        if not (isinstance(target, ast.Name) and target.id == "torch" and node.func.attr in FACTORIES):
            continue
        if any(k.arg == "device" for k in node.keywords) or "# host" in lines[node.lineno - 1]:
            continue
        found.append(f"{path.name}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return found


def test_engine_decode_creates_no_tensor_without_a_device() -> None:
    files = [p for p in (SRC / "engine" / "local").rglob("*.py") if p.name in ENGINE_DECODE]
    assert len(files) == len(ENGINE_DECODE)
    assert [line for p in files for line in _unplaced(p)] == []


def test_device_config() -> None:
    assert resolve_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="torch sees no GPU"):
            resolve_device("cuda")
    with pytest.raises(ConfigError, match=r"engine\.kernel=native runs on the CPU only"):
        load_config(None, ["device=cuda", "rollout.engine.kernel=native"])
    config = load_config(None, ["model.preset=nano", "device=cpu"])
    model = make_model(config, HarmonyTokenizer.load_default())
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert check_engine(config, model).startswith("decode native")  # on the CPU, auto still picks the C step
