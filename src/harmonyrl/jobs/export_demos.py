"""``harmonyrl sft --export-demos FILE``: the built-in scripted expert's demonstrations as a JSONL file in the
``sft.demos`` schema, so a user sees a valid example and ``sft.demos=FILE`` reproduces the expert's warm start."""

from __future__ import annotations

from pathlib import Path

from harmonyrl.config import RunConfig
from harmonyrl.harmony.demo_schema import DemoConversation
from harmonyrl.run.setup import make_factory
from harmonyrl.sft.train import expert_episodes
from harmonyrl.tasks.factory import expert_for


async def export_expert_demos(config: RunConfig, path: Path) -> int:
    """Write the expert's demonstrations of the env's first train tasks to ``path`` (JSONL); return how many.

    The same tasks, seed and expert settings as the warm start of a run with this config (``sft.steps ×
    sft.batch_size`` tasks at most; all train tasks when ``sft.steps=0``), each with its ``task_id`` and the full
    prompt ``env.reset()`` gives, so the file renders to exactly the expert path's token ids."""
    cfg = config.sft
    factory = make_factory(config)
    train = factory.tasks("train")
    tasks = train[: cfg.steps * cfg.batch_size] if cfg.steps > 0 else train
    expert = expert_for(config.env, cfg.expert)
    episodes = await expert_episodes(factory, expert, tasks, config.seed)
    lines = [
        DemoConversation.from_messages([*prefix, *demo], task.id).model_dump_json(exclude_none=True) + "\n"
        for task, (prefix, demo) in zip(tasks, episodes, strict=True)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(lines), encoding="utf-8")
    return len(lines)
