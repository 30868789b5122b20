"""``harmonyrl rm pairs``: preference pairs for a code-checked env, made from a checkpoint, no download needed.

For each training task the checkpoint samples two answers (two episodes, different seeds, the run's sampling
settings); the code checkers rank them: by ``constraints_met`` (instruct: the fraction of its constraints that
hold) when the env logs it, else by the episode reward. A tie says nothing about which is better and is dropped;
an episode lost to an environment fault drops its pair too; both are counted. The pairs are written as plain-text
rows of the TRL format (:mod:`harmonyrl.rewards.pairs`) with the two scores beside them (``chosen_met``,
``rejected_met``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harmonyrl.config import RunConfig
from harmonyrl.envs.loader import UserCodeError
from harmonyrl.envs.team import TeamFactory
from harmonyrl.harmony.codecs import load_codec
from harmonyrl.rewards.episodes import checked_score, episode_answer
from harmonyrl.rewards.pair_files import write_pairs_jsonl
from harmonyrl.rollout.scheduler import group_requests, run_episodes
from harmonyrl.run.setup import adapts_threads, load_for, make_engine, make_factory, setup_process
from harmonyrl.tasks.factory import check_before_compute
from harmonyrl.types import SamplingParams, Task, Trajectory


@dataclass(frozen=True)
class PairStats:
    prompts: int
    pairs: int
    ties: int
    """Prompts whose two answers the checkers scored the same (dropped)."""
    failed: int
    """Prompts with an episode lost to an environment fault (dropped)."""

    def line(self, out: Path) -> str:
        """The console's summary of a generation written to ``out``."""
        return (
            f"{self.pairs} pairs from {self.prompts} prompts to {out} "
            f"({self.ties} ties and {self.failed} environment faults dropped)"
        )


def pair_row(task: Task, a: Trajectory, b: Trajectory) -> dict[str, object] | None:
    """The TRL row of two episodes of ``task``, better first; None for a tie."""
    sa, sb = checked_score(a), checked_score(b)
    if sa == sb:
        return None
    (win, sw), (lose, sl) = sorted([(a, sa), (b, sb)], key=lambda x: -x[1])
    return {
        "prompt": task.prompt,
        "chosen": episode_answer(win),
        "rejected": episode_answer(lose),
        "task_id": task.id,
        "chosen_met": sw,
        "rejected_met": sl,
    }


async def generate_pairs(config: RunConfig, checkpoint: Path, n_prompts: int, out: Path) -> PairStats:
    """Sample two answers per training task of ``config.env`` from ``checkpoint`` and write the ranked pairs."""
    setup_process(config.seed, config.threads, adapts_threads(config))
    tok = load_codec(config.model.tokenizer)
    factory = make_factory(config)
    if isinstance(factory, TeamFactory):  # run_episodes would play the first role only: pairs of half episodes
        raise UserCodeError(f"env.name={config.env.name} is a team env: preference pairs are made for one agent's envs")
    await check_before_compute(config.env, factory, config.seed)
    model = load_for(checkpoint, tok, config.rollout.max_seq_len)
    engine, limits = await make_engine(config, model, None)
    tasks = list(factory.tasks("train")[:n_prompts])
    r = config.rollout
    params = SamplingParams(r.temperature, r.top_p, r.top_k, stop_ids=(tok.special.call, tok.special.return_))
    try:
        result = await run_episodes(
            engine, factory, tok, group_requests(tasks, 2, config.seed * 100_003), params, limits, r.engine.concurrency
        )
    finally:
        await engine.close()
    by_task: dict[str, list[Trajectory]] = {}
    for traj in result.trajectories:
        by_task.setdefault(traj.task_id, []).append(traj)
    rows: list[dict[str, object]] = []
    ties = failed = 0
    for task in tasks:
        a, b = by_task[task.id]
        if a.failure is not None or b.failure is not None:
            failed += 1
        elif (row := pair_row(task, a, b)) is None:
            ties += 1
        else:
            rows.append(row)
    write_pairs_jsonl(rows, out)
    return PairStats(len(tasks), len(rows), ties, failed)
