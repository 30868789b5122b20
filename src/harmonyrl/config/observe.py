"""The ``eval`` and ``telemetry`` sections: what a run measures on held-out tasks, and what it records."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from harmonyrl.frozen import Frozen


class EvalConfig(Frozen):
    n_tasks: int = Field(200, ge=1)
    """Held-out tasks evaluated before and after RL."""
    temperature: float = Field(1.0, gt=0)
    """Sampling temperature of ``eval/pass@1`` (the policy as it acts in training). Greedy success
    (``eval_greedy/success``) is always measured too: the two can move differently under RL."""
    samples_per_task: int = Field(4, ge=1)
    """Samples per task averaged into ``eval/pass@1`` (more samples, less noise)."""
    every: int = Field(0, ge=0)
    """Also evaluate every N RL steps (0: only before and after)."""
    split: Literal["validation", "test"] = "test"
    """The env split evaluated: ``test`` reports a run; ``validation`` is where settings are chosen (``harmonyrl
    sweep`` sets it for its trials), so the test figure of the chosen settings is measured once (docs/envs.md)."""


class TelemetryConfig(Frozen):
    """Where metrics go besides ``metrics.jsonl`` (always written), and what else a run records."""

    tensorboard: bool = False
    """Also write TensorBoard event files to the run folder (needs ``pip install harmonyrl[tensorboard]``)."""
    wandb: bool = False
    """Also log to Weights & Biases in offline mode (no account needed; ``pip install harmonyrl[wandb]``)."""
    record_episodes: bool = True
    """Append every RL step's episodes to ``rollouts/episodes.jsonl`` (readable in the report)."""
    record_rollouts: bool = True
    """Store every RL step's episodes token for token in ``rollouts/step_NNNNN.parquet`` (for
    ``harmonyrl replay`` / ``show``): ids, loss mask, sampler log-probs, rewards, turns, failures."""
    progress_every_s: float = Field(15.0, ge=0, le=3600)
    """Without a terminal (``nohup … > log``, CI, a pipe): print a plain progress line (step/total, latest
    figures, elapsed, ETA) at most every this many seconds, and at each phase change (0: every step). On a
    terminal a live bar is shown instead."""
