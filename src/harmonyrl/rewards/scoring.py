"""Learned and judged reward terms joined to an RL step's episodes, after the env has scored them.

An episode's reward becomes ``env_weight · env reward + model_weight · r_model + judge_weight · judge score``, and its
``reward_terms`` gain ``reward/env``, ``reward/model`` and ``reward/judge`` (each weighted), so the rollout store and
``show`` log each term separately beside the env's own. Episodes with an environment fault are not scored (they are
masked already). A judge reply without a score masks its episode with a ``reward_error`` failure, never a 0.

Where it runs: in the trainer's process, after the step's rollouts. The reward model's forward passes run in a
worker thread (``asyncio.to_thread``), off the event loop, ``model_batch`` episodes at a time; the judge's requests go
to its engine concurrently, which batches them.

Step metrics: ``reward/<term>`` means, ``reward/<term>_agreement`` (within each group, among pairs of episodes the
code checkers rank differently, the fraction the term ranks the same way; :func:`ranking_agreement`), the reward
model's seconds, and the judge's tokens and seconds per episode, cache hits and parse failures by kind.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace

from harmonyrl.algorithms.preference import ranking_agreement
from harmonyrl.harmony.tokenizer import Codec
from harmonyrl.rewards.config import RewardConfig
from harmonyrl.rewards.episodes import answer_messages, checked_score, episode_answer, prompt_messages
from harmonyrl.rewards.judge import Judge, Verdict
from harmonyrl.rewards.model import RewardModel, answer_ids
from harmonyrl.types import Failure, Trajectory


class Rewarder:
    """Scores episodes with a reward model and/or a judge and composes their terms with the env's reward."""

    def __init__(
        self,
        cfg: RewardConfig,
        codec: Codec,
        prompts: Mapping[str, str],
        model: RewardModel | None = None,
        judge: Judge | None = None,
    ) -> None:
        self.cfg = cfg
        self.codec = codec
        self.prompts = prompts
        """Task id → prompt text, for every task an episode may come from."""
        self.model = model
        self.judge = judge

    def _model_scores(self, trajs: Sequence[Trajectory]) -> list[float]:
        assert self.model is not None
        rows = [
            answer_ids(self.codec, prompt_messages(self.prompts[t.task_id]), answer_messages(episode_answer(t)),
                       self.model.max_len)
            for t in trajs
        ]  # fmt: skip
        return self.model.score(rows, self.cfg.model_batch)

    async def apply(self, trajs: Sequence[Trajectory]) -> tuple[list[Trajectory], dict[str, float]]:
        """The episodes with their rewards recomposed, and the step's ``reward/*``, ``rm/*``, ``judge/*`` metrics."""
        healthy = [t for t in trajs if t.failure is None]
        metrics: dict[str, float] = {}
        model: list[float | None] = [None] * len(healthy)
        if self.model is not None and healthy:
            t0 = time.perf_counter()
            model = list(await asyncio.to_thread(self._model_scores, healthy))
            metrics["rm/seconds"] = time.perf_counter() - t0
        verdicts: list[Verdict | None] = [None] * len(healthy)
        if self.judge is not None and healthy:
            hits = self.judge.hits
            judge = self.judge
            verdicts = list(await asyncio.gather(*(judge.judge(self.prompts[t.task_id], episode_answer(t))
                                                   for t in healthy)))  # fmt: skip
            metrics |= judge_metrics([v for v in verdicts if v is not None], self.judge.hits - hits)
        composed = [self._compose(t, m, v) for t, m, v in zip(healthy, model, verdicts, strict=True)]
        by_id = {id(t): c for t, c in zip(healthy, composed, strict=True)}
        out = [by_id.get(id(t), t) for t in trajs]
        return out, metrics | term_metrics(composed, [checked_score(t) for t in healthy])  # truth: before composing

    def _compose(self, t: Trajectory, model: float | None, verdict: Verdict | None) -> Trajectory:
        c = self.cfg
        terms = dict(t.reward_terms)
        terms["reward/env"] = c.env_weight * t.reward
        total = terms["reward/env"]
        if model is not None:
            terms["reward/model"] = c.model_weight * model
            total += terms["reward/model"]
        if verdict is not None and c.judge is not None:
            terms["judge/tokens"], terms["judge/seconds"] = float(verdict.tokens), verdict.seconds
            if verdict.score is None:
                detail = f"judge: {verdict.failure.kind}: {verdict.failure.detail}" if verdict.failure else "judge"
                return replace(t, reward_terms=terms, failure=Failure("reward_error", detail))
            terms["reward/judge"] = c.judge.weight * verdict.score
            total += terms["reward/judge"]
        return replace(t, reward=total, reward_terms=terms)


def judge_metrics(verdicts: Sequence[Verdict], hits: int) -> dict[str, float]:
    """Cost and failures of one step's verdicts: tokens and seconds per episode (cached ones cost 0)."""
    n = max(len(verdicts), 1)
    failures = Counter(v.failure.kind for v in verdicts if v.failure is not None)
    out = {
        "judge/tokens_per_episode": sum(v.tokens for v in verdicts) / n,
        "judge/seconds_per_episode": sum(v.seconds for v in verdicts) / n,
        "judge/cache_hits": float(hits),
        "judge/parse_failures": float(sum(failures.values())),
    }
    return out | {f"judge/failure_{kind}": float(count) for kind, count in sorted(failures.items())}


def term_metrics(trajs: Sequence[Trajectory], truth: Sequence[float]) -> dict[str, float]:
    """Mean of each composed term over the episodes that have it (one the judge masked keeps its env and model
    terms), and its agreement with the code-checked ``truth``."""
    ok = list(zip(trajs, truth, strict=True))
    out: dict[str, float] = {}
    for term in ("reward/env", "reward/model", "reward/judge"):
        have = [(t.reward_terms[term], y, t.group_id) for t, y in ok if term in t.reward_terms]
        if not have:
            continue
        values, ys, groups = zip(*have, strict=True)
        out[term] = sum(values) / len(values)
        out[f"{term}_agreement"] = ranking_agreement(values, ys, groups)
    return out
