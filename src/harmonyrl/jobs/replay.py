"""``harmonyrl replay``: re-run one RL step's update from its recorded episodes, without generating.

Why this is bit-exact on CPU: everything ``Learner.update`` reads is either stored losslessly or rebuilt
exactly. The episodes come back equal from :mod:`.store`; the weights, optimizer and learner state before the
step come from a checkpoint (safetensors and ``torch.save`` of plain data are lossless; read back with
``weights_only=True``, so a crafted run folder cannot run code); the reference model is the policy
at RL start (``checkpoints/sft``, or the configured start model when there was no SFT), as in ``train``;
the update itself draws no random numbers (the model runs in eval mode, the soft-Q replay buffer carries its
own RNG in the learner state, the value head starts at zero). The process is set up as ``train`` sets it up
(same thread count, deterministic kernels), because float reductions depend on the thread count.

Which weights are "before step N": step 1 starts from the RL start weights with a fresh learner; step N > 1
starts from a checkpoint saved after step N - 1 when there is one (``checkpoint``, e.g. ``replay --save DIR`` of
step N - 1, or ``checkpoints/last`` when the run stopped there). A run keeps only its newest ``last``, so without
one the state before step N is rebuilt from the episodes alone: steps 1 … N - 1 are replayed from the RL start
in memory, each bit-exact, so the chain reaches exactly the state the run had.

What a replay is checked against: the step's row of ``metrics.jsonl`` always (every metric the update computes —
loss, grad norm, entropy, KL, clip fraction, mismatch, routing — must be equal, NaN to NaN), and the weights bit
for bit where the run has a checkpoint of the state after the step (``final`` for its last step, ``last``).

Re-scoring (:func:`rescore`) replays each episode's assistant turns through a fresh environment and sums the
rewards again. It is a check of the *environment*, not of training, and is not always reproducible: a tool
may time out now where it did not then (timings differ run to run), and episodes recorded with an
environment failure have no trustworthy reward. Both kinds are skipped and left out of the result.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch

from harmonyrl.config import RunConfig, load_config
from harmonyrl.errors import CheckpointError
from harmonyrl.harmony.codecs import load_codec
from harmonyrl.models.attention import set_kernel
from harmonyrl.rl.learner import Learner
from harmonyrl.rollout.store import list_steps, read_step, step_path
from harmonyrl.run.checkpoint import committed, load_state, save_checkpoint
from harmonyrl.run.resume import last_dir
from harmonyrl.run.setup import adapts_threads, load_for, make_factory, rl_start_model, setup_process
from harmonyrl.telemetry.metrics import read_metrics
from harmonyrl.types import Task, Trajectory, Turn


@dataclass(frozen=True)
class ReplayResult:
    step: int
    metrics: dict[str, float]
    """What ``Learner.update`` returned for the replayed step (compare with the step's row in metrics.jsonl)."""
    state_dict: dict[str, torch.Tensor]
    """The policy's weights after the replayed update."""
    compared_with: Path | None
    """The run's checkpoint holding the weights after this step, if it has one."""
    identical: bool | None
    """Every weight tensor equal bit for bit to ``compared_with`` (None: nothing to compare with)."""
    differing: tuple[str, ...] = ()
    """Names of the tensors that differ (empty when identical)."""
    recorded: dict[str, float] | None = None
    """The step's metrics as ``metrics.jsonl`` recorded them (the keys the update computes), None if it has no
    row for the step."""
    chained: int = 0
    """Steps replayed first to rebuild the state before this one (no checkpoint of it was at hand)."""

    @property
    def metric_diffs(self) -> list[tuple[str, float, float]]:
        """(name, replayed, recorded) of every update metric whose recorded value differs."""
        if self.recorded is None:
            return []
        return [
            (k, v, r)
            for k, v in sorted(self.metrics.items())
            if (r := self.recorded.get(k, v)) != v and not _both_nan(v, r)
        ]

    @property
    def matches_metrics(self) -> bool | None:
        """Every update metric equal to the recorded one (None: no recorded row to compare with)."""
        return None if self.recorded is None else not self.metric_diffs


class ReplayError(ValueError):
    """A replay request that cannot be served as asked (step out of range, episode of an unknown task)."""


class RescoreRow(NamedTuple):
    task_id: str
    stored_reward: float
    new_reward: float


def replay_update(learner: Learner, trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """One RL update on recorded episodes: exactly the call the training loop makes after its rollout."""
    return learner.update(trajectories).metrics


def _read_state(folder: Path) -> dict[str, Any]:
    """The checkpoint's trainer state, read as data only (see :func:`harmonyrl.run.checkpoint.load_state`)."""
    return load_state(folder)


def _last(run_dir: Path) -> Path:
    """``checkpoints/last``, or ``last.old`` when the run was stopped between a checkpoint's two renames."""
    return committed(last_dir(run_dir)) or last_dir(run_dir)


def _rl_step_of(folder: Path) -> int | None:
    """The RL step a checkpoint folder was saved after, or None (absent, SFT progress, unreadable)."""
    try:
        state = _read_state(folder)
    except CheckpointError:
        return None
    return state["step"] if state.get("phase", "rl") == "rl" else None


def _both_nan(a: float, b: float) -> bool:
    return math.isnan(a) and math.isnan(b)


def _pre_step_checkpoint(run_dir: Path, step: int, checkpoint: Path | None) -> Path | None:
    """The checkpoint holding the state before ``step`` (> 1): ``checkpoint``, or ``checkpoints/last`` when it is
    at step - 1; None when neither (the state is then rebuilt from the episodes). A ``checkpoint`` at another step
    is a CheckpointError."""
    if checkpoint is None:
        return _last(run_dir) if _rl_step_of(_last(run_dir)) == step - 1 else None
    need = f"replaying RL step {step} needs the checkpoint saved after RL step {step - 1}"
    state = _read_state(checkpoint)
    if state.get("phase", "rl") != "rl" or state["step"] != step - 1:
        got = f"{state['phase']} step {state['step']}" if "phase" in state else f"step {state['step']}"
        raise CheckpointError(f"{need}; '{checkpoint}' was saved at {got}")
    return checkpoint


def build_learner(config: RunConfig, run_dir: Path, step: int, checkpoint: Path | None) -> tuple[Learner, int]:
    """The learner exactly as ``train`` holds it right before RL step ``step`` (1-based), and how many steps were
    replayed to get there (0 when a checkpoint was at hand)."""
    tok = load_codec(config.model.tokenizer)
    pad, norm = tok.special.endoftext, float(config.rollout.max_seq_len)
    sft = run_dir / "checkpoints" / "sft"
    if config.sft.steps > 0 and config.model.init_from is None and not (sft / "config.json").is_file():
        # rl_start_model would fall back to a fresh model: a wrong reference (and step-1 start), silently
        raise CheckpointError(f"'{sft}' is missing: it holds the weights RL started from (the reference model)")
    if step == 1 and checkpoint is not None:
        raise CheckpointError("replaying RL step 1 starts from the RL start weights; do not pass a checkpoint")
    folder = _pre_step_checkpoint(run_dir, step, checkpoint) if step > 1 else None
    if folder is None:  # from the RL start, through every earlier step's recorded episodes
        learner = Learner.create(config.rl, rl_start_model(config, run_dir, tok), pad, norm, config.seed)
        for earlier in range(1, step):
            replay_update(learner, _episodes_before(run_dir, earlier, step))
        return learner, step - 1
    state = _read_state(folder)
    learner = Learner.create(config.rl, rl_start_model(config, run_dir, tok), pad, norm, config.seed)
    model = load_for(folder, tok)
    set_kernel(model, config.model.attention)
    learner.model, learner.optimizer = model, learner.optimizer_for(model)
    if state.get("optimizer") is None:
        raise CheckpointError(f"checkpoint '{folder}' has no optimizer state")
    learner.optimizer.load_state_dict(state["optimizer"])
    extra = state.get("learner", {})
    if learner.rule.state_dict() and not extra:
        raise CheckpointError(f"checkpoint '{folder}' has no learner state (value head / soft-Q), needed here")
    learner.rule.load_state_dict(extra)
    return learner, 0


def _episodes_before(run_dir: Path, earlier: int, step: int) -> list[Trajectory]:
    """Step ``earlier``'s episodes, to rebuild the state before ``step``; a one-line error if not recorded."""
    path = step_path(run_dir, earlier)
    if not path.is_file():
        raise CheckpointError(
            f"replaying RL step {step} without a checkpoint replays steps 1-{step - 1} first, but '{path}' is "
            f"missing; pass --checkpoint DIR, the state after RL step {step - 1} (`harmonyrl replay --save DIR` of "
            "that step, or checkpoints/last of a run stopped there)"
        )
    return read_step(path)


def recorded_metrics(run_dir: Path, step: int, keys: Iterable[str]) -> dict[str, float] | None:
    """RL step ``step``'s recorded values of ``keys`` from ``metrics.jsonl`` (None: no row for the step)."""
    path = run_dir / "metrics.jsonl"
    rows = [r for r in read_metrics(path) if r.get("phase") == "rl" and r.get("step") == step] if path.is_file() else []
    if not rows:
        return None
    row = rows[-1]  # a resumed run re-wrote the step: the last row is the one that stands
    # non-finite values are written as strings ("nan", "inf"), which float() reads back
    return {k: float(v) for k in keys if isinstance(v := row.get(k), int | float | str) and _is_number(v)}


def _is_number(value: object) -> bool:
    try:
        float(value)  # type: ignore[arg-type]  # int, float or str, as checked by the caller
    except ValueError:
        return False
    return True


def _after_step_checkpoint(run_dir: Path, step: int) -> Path | None:
    """The run's checkpoint of the weights after ``step``: ``final`` if the step is the last one recorded
    (``final`` is written right after the RL loop ends, also when guards stop it early), else ``last`` if it
    was saved at that step (``last`` is overwritten after every step, so only the newest step has one)."""
    final = run_dir / "checkpoints" / "final"
    if (final / "config.json").is_file() and step == max(list_steps(run_dir), default=0):
        return final
    if _rl_step_of(_last(run_dir)) == step:
        return _last(run_dir)
    return None


def differing_tensors(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> tuple[str, ...]:
    """Names whose tensors are not bit-identical (``torch.equal``), including names present on one side only."""
    names = sorted(set(a) | set(b))
    return tuple(n for n in names if n not in a or n not in b or not torch.equal(a[n], b[n]))


def replay_step(run_dir: Path, step: int, checkpoint: Path | None = None, save_to: Path | None = None) -> ReplayResult:
    """Re-run RL step ``step`` of ``run_dir`` from its recorded episodes and compare with the run's weights.

    ``save_to`` writes the state after the replayed step as a checkpoint (weights, optimizer, learner state,
    like ``checkpoints/last``), so replays chain: step N + 1 can then be replayed with ``checkpoint=save_to``
    even though the run itself kept only its newest ``last``. Sets the process up like ``train`` (seeds,
    ``config.threads``, deterministic kernels): call it from a command or test process, not inside a run.
    """
    run_dir = Path(run_dir)
    config = load_config(run_dir / "config.yaml")
    if not 1 <= step <= config.rl.steps:
        raise ReplayError(f"step must be between 1 and rl.steps={config.rl.steps}, got {step}")
    trajectories = read_step(step_path(run_dir, step))  # a missing record fails before any model is loaded
    setup_process(config.seed, config.threads, adapts_threads(config))
    learner, chained = build_learner(config, run_dir, step, checkpoint)
    metrics = replay_update(learner, trajectories)
    recorded = recorded_metrics(run_dir, step, metrics)
    weights = {k: v.detach().clone() for k, v in learner.model.state_dict().items()}
    if save_to is not None:
        extra = {"phase": "rl", "learner": learner.rule.state_dict(), "replayed_from": str(run_dir)}
        save_checkpoint(Path(save_to), learner.model, learner.optimizer, step, extra)
    after = _after_step_checkpoint(run_dir, step)
    if after is None:
        return ReplayResult(step, metrics, weights, None, None, (), recorded, chained)
    saved = load_for(after, load_codec(config.model.tokenizer)).state_dict()
    diff = differing_tensors(weights, saved)
    return ReplayResult(step, metrics, weights, after, not diff, diff, recorded, chained)


# ---------------------------------------------------------------- re-scoring through the env


def _was_stepped(traj: Trajectory, turn: Turn) -> bool:
    """Whether the agent loop passed this turn to ``env.step``: it does not for a malformed message or one cut
    off by the token budget (the episode's last turn, truncated, with no observations and no tool time)."""
    if turn.parse_error is not None:
        return False
    return not (traj.truncated and not turn.observations and turn.tool_s == 0.0)


async def rescore_trajectories(config: RunConfig, trajectories: Sequence[Trajectory]) -> tuple[list[RescoreRow], int]:
    """(task_id, stored reward, new reward) per reproducible episode, and how many were skipped."""
    factory = make_factory(config)
    tasks: dict[str, Task] = {t.id: t for split in ("train", "test") for t in factory.tasks(split)}
    rows: list[RescoreRow] = []
    skipped = 0
    for traj in trajectories:
        if traj.failure is not None:
            skipped += 1
            continue
        task = tasks.get(traj.task_id)
        if task is None:
            raise ReplayError(f"task '{traj.task_id}' is not in the run's environment (was env.* changed?)")
        env = factory.make(task)
        reward, failed = 0.0, False
        try:
            await env.reset()
            for turn in traj.turns:
                if not _was_stepped(traj, turn):
                    break
                result = await env.step(turn.sampled)
                reward += result.reward
                if result.failure is not None:
                    failed = True
                    break
                if result.terminated or result.truncated:
                    break
        finally:
            await env.close()
        if failed:
            skipped += 1
        else:
            rows.append(RescoreRow(traj.task_id, traj.reward, reward))
    return rows, skipped


def rescore(run_dir: Path, step: int) -> list[RescoreRow]:
    """Re-score RL step ``step``'s recorded episodes through fresh environments (failed episodes skipped)."""
    run_dir = Path(run_dir)
    config = load_config(run_dir / "config.yaml")
    rows, _ = asyncio.run(rescore_trajectories(config, read_step(step_path(run_dir, step))))
    return rows
