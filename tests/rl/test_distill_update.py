"""``rl.distill.kind=full`` in the update: the exact reverse KL over the vocabulary as a loss term."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harmonyrl.algorithms.distill import full_reverse_kl
from harmonyrl.config import RLConfig
from harmonyrl.config.rl import DistillConfig
from harmonyrl.learn.batch import collate, score
from harmonyrl.models.tiny_gpt_oss import build_config, build_model
from harmonyrl.rl.targets import Prepared
from harmonyrl.rl.update import rl_update
from harmonyrl.run.checkpoint import save_checkpoint
from harmonyrl.types import Trajectory

VOCAB = 97


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model(build_config("nano", VOCAB, 0, 1), seed=seed).eval()


def _prepared() -> Prepared:
    """Six episodes, each its own group (GRPO's advantages all 0: the teacher's term is the only force)."""
    trajs = []
    for i in range(6):
        g = torch.Generator().manual_seed(i)
        ids = torch.randint(1, VOCAB, (20 + 3 * i,), generator=g).tolist()
        mask = [0] * 8 + [1] * (len(ids) - 8)
        trajs.append(Trajectory(f"t{i}", i, tuple(ids), tuple(mask), (-1.0,) * len(ids), 1.0, True, False, None, ()))
    return Prepared(collate(trajs, pad_id=0), 0, 0)


def _kl(student: torch.nn.Module, teacher: torch.nn.Module, prepared: Prepared) -> float:
    """The masked token mean of the exact reverse KL, computed here from both models' logits."""
    b = prepared.batch
    with torch.no_grad():
        s = score(student, b.input_ids, b.attention_mask, keep_logits=True).logits
        t = score(teacher, b.input_ids, b.attention_mask, keep_logits=True).logits
    assert s is not None and t is not None
    m = b.loss_mask.bool()
    return float(full_reverse_kl(s, t)[m].mean())


def _cfg(tmp_path: Path, teacher: torch.nn.Module, **distill: object) -> RLConfig:
    folder = save_checkpoint(tmp_path / "teacher", teacher, None, 0, {})
    return RLConfig(lr=1e-2, distill=DistillConfig(teacher=folder, kind="full", **distill))  # type: ignore[arg-type]


def test_the_full_term_pulls_the_student_to_the_teacher(tmp_path: Path) -> None:
    student, teacher, prepared = _model(0), _model(1), _prepared()
    cfg = _cfg(tmp_path, teacher, env_reward=False)
    opt = torch.optim.AdamW(student.parameters(), lr=cfg.lr)
    before = _kl(student, teacher, prepared)
    first = rl_update(student, opt, prepared, cfg, None, teacher=teacher).metrics
    # the metric is the term's value on the update's one pass, i.e. before the step
    assert first["distill/full_reverse_kl"] == pytest.approx(before, rel=1e-4)
    for _ in range(5):
        rl_update(student, opt, prepared, cfg, None, teacher=teacher)
    after = _kl(student, teacher, prepared)
    assert before > 0.01 and after < 0.75 * before, (before, after)  # measured: 0.0249 -> 0.0162


def test_a_student_equal_to_its_teacher_has_no_full_term(tmp_path: Path) -> None:
    student, prepared = _model(0), _prepared()
    teacher = _model(0)
    cfg = _cfg(tmp_path, teacher)
    metrics = rl_update(student, torch.optim.SGD(student.parameters(), lr=1.0), prepared, cfg, None,
                        teacher=teacher).metrics  # fmt: skip
    assert metrics["distill/full_reverse_kl"] == pytest.approx(0.0, abs=1e-6)
    # zero advantages and zero KL: no gradient (the grad pass and the teacher's no-grad pass differ by rounding)
    assert metrics["train/grad_norm"] < 1e-6


def test_the_weight_scales_the_term(tmp_path: Path) -> None:
    teacher, prepared = _model(1), _prepared()
    moved = []
    for weight in (1.0, 2.0):
        student = _model(0)
        cfg = _cfg(tmp_path, teacher, weight=weight, env_reward=False)
        rl_update(student, torch.optim.SGD(student.parameters(), lr=1.0), prepared, cfg, None, teacher=teacher)
        moved.append(torch.cat([(p - q).flatten() for p, q in zip(student.parameters(), _model(0).parameters(),
                                                                    strict=True)]))  # fmt: skip
    # SGD: the step is linear in the weight (up to float32 rounding of the weights)
    assert float((moved[1] - 2 * moved[0]).norm() / moved[1].norm()) < 1e-3


def test_the_full_term_needs_its_teacher(tmp_path: Path) -> None:
    student, prepared = _model(0), _prepared()
    cfg = _cfg(tmp_path, _model(1))
    with pytest.raises(ValueError, match="needs the teacher model"):
        rl_update(student, torch.optim.SGD(student.parameters(), lr=1.0), prepared, cfg, None)
