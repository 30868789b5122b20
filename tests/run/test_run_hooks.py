"""A caller's hooks see every evaluation and every RL step, and change nothing of the run.

Two identical tiny runs, one with hooks that record what they are shown: same metrics and the same final weights,
while the hooks were entered around each of the 3 evaluations (before RL, at step 2 with ``eval.every=2``, after
RL) and called after each of the 3 RL steps with the policy as that step left it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from rich.console import Console
from safetensors.torch import load_file

from harmonyrl.config import load_config
from harmonyrl.jobs.train import train
from harmonyrl.run.hooks import RunHooks
from tiny_run import tiny_run


def _run(tmp_path: Path, name: str, hooks: RunHooks | None) -> list[dict[str, object]]:
    config = load_config(
        None,
        [
            *tiny_run("rl.steps=3", "eval.every=2", "rl.skip_zero_variance_groups=false", "rl.entropy_coef=0.01"),
            f"output_dir={tmp_path}",
            f"run_name={name}",
        ],
    )
    kwargs = {"hooks": hooks} if hooks is not None else {}
    asyncio.run(train(config, Console(quiet=True), **kwargs))
    rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "engine/")) and "_s" not in k} for r in rows]


def test_hooks_see_each_evaluation_and_step_and_change_nothing(tmp_path: Path) -> None:
    events: list[str] = []
    states: list[dict[str, torch.Tensor]] = []

    @contextmanager
    def on_eval() -> Iterator[None]:
        events.append("eval")
        yield
        events.append("eval end")

    def on_step(step: int, model: torch.nn.Module) -> None:
        events.append(f"step {step}")
        states.append({k: v.detach().clone() for k, v in model.state_dict().items()})

    hooks = RunHooks(on_eval, lambda metrics: events.append(f"done {metrics['eval/success']:.3f}"), on_step)
    watched = _run(tmp_path, "watched", hooks)
    plain = _run(tmp_path, "plain", None)
    assert watched == plain
    # the evaluation at step 2 runs inside that step, before it is saved and handed to on_step
    expected = ["eval", "eval end", "done", "step 1", "eval", "eval end", "done", "step 2", "step 3", "eval",
                "eval end", "done"]  # fmt: skip
    assert [e if not e.startswith("done") else "done" for e in events] == expected
    final = load_file(tmp_path / "watched" / "checkpoints" / "final" / "model.safetensors")
    assert all(torch.equal(final[k], states[-1][k]) for k in final)
    assert not all(torch.equal(states[0][k], states[-1][k]) for k in final)  # the steps' policies differ
