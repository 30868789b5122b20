"""The tiny ``harmonyrl train`` run the end-to-end tests start, as command-line overrides.

Importable from every test folder as ``from tiny_run import ...`` (``tests/`` is on ``sys.path``, see
``tests/conftest.py``). A test states only what its run needs differently, so that is what the reader sees.
"""

from __future__ import annotations

from pathlib import Path

TINY_RUN: dict[str, str] = {
    "model.preset": "nano",
    "sft.steps": "3",
    "sft.batch_size": "4",
    "rl.steps": "2",
    "rollout.tasks_per_step": "2",
    "rollout.group_size": "2",
    "rollout.max_new_tokens": "24",
    "eval.n_tasks": "4",
    "env.n_train": "64",
    "env.n_test": "8",
}
"""A nano model, 3 SFT steps, 2 RL steps of 2 tasks × 2 episodes, a 4-task held-out evaluation."""


def tiny_run(*changes: str) -> list[str]:
    """The tiny run's ``key=value`` overrides, each of ``changes`` replacing a key's value or adding a key."""
    merged = dict(TINY_RUN)
    for change in changes:
        key, sep, value = change.partition("=")
        if not sep:
            raise ValueError(f"expected key=value, got {change!r}")
        merged[key] = value
    return [f"{key}={value}" for key, value in merged.items()]


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (relative path → bytes): what "a failed resume changes nothing" compares."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
