"""The scripted engine every test that needs an engine without a model uses.

Importable from every test folder as ``from fakes import ...``: pytest puts ``tests/`` on ``sys.path`` because
``tests/conftest.py`` lives there (the test folders are not packages).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping, Sequence

import torch
from transformers import GptOssForCausalLM

from harmonyrl.harmony.render import render_completion
from harmonyrl.harmony.tokenizer import HarmonyTokenizer
from harmonyrl.learn.update_result import UpdateResult
from harmonyrl.tasks.calculator import expression_of
from harmonyrl.types import Generation, Message, SamplingParams, Task, Trajectory

LOGPROB = -0.5
"""The sampler log-prob a scripted engine reports for every token."""

Script = Callable[[Sequence[int]], Sequence[int]]
"""The next completion's token ids, as a function of the prompt."""


class ScriptedEngine:
    """An engine (the ``Engine`` protocol) that answers from a script instead of a model.

    ``script`` is either the completions to return in order (one per ``generate`` call), or a function of the
    prompt, so concurrent episodes each get their own course whatever the scheduling order. A completion is
    cut at the request's ``max_new_tokens``; it finished with ``"stop"`` when its last token is a stop id,
    else ``"length"``, as the real engine reports it. Every token's log-prob is :data:`LOGPROB`.
    """

    def __init__(self, script: Sequence[Sequence[int]] | Script) -> None:
        self.prompts: list[list[int]] = []
        """Every prompt the engine was asked to continue, in order."""
        self.policy_version = 0
        """The version of the last ``sync_weights`` (the real engines' counter; no weights here)."""
        if callable(script):
            self.script = script
        else:
            queue = [list(c) for c in script]
            self.script = lambda _prompt: queue.pop(0)

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        self.prompts.append(list(prompt_ids))
        ids = list(self.script(prompt_ids))[: params.max_new_tokens]
        stop = bool(ids) and ids[-1] in params.stop_ids
        reason = "stop" if stop else "length"
        return Generation(tuple(ids), tuple([LOGPROB] * len(ids)), reason, policy_version=self.policy_version)

    async def sync_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        self.policy_version = version

    def metrics_window(self) -> None:
        return None

    async def close(self) -> None: ...


def calculator_solver(tok: HarmonyTokenizer, tasks: Sequence[Task]) -> ScriptedEngine:
    """Solves calculator tasks (found among ``tasks`` by their prompt): the first turn calls the calculator
    with the task's expression, every later turn answers with the task's answer."""

    def script(prompt: Sequence[int]) -> list[int]:
        text = tok.decode(prompt)
        task = next(t for t in tasks if t.prompt in text)
        if "<|call|>" in text:
            return render_completion(tok, [Message("assistant", task.answer, "final")])
        args = json.dumps({"expression": expression_of(task)})
        return render_completion(tok, [Message("assistant", args, "commentary", "functions.calculator",
                                                content_type="json")])  # fmt: skip

    return ScriptedEngine(script)


class SteppingTrainer:
    """The trainer side of a fake RL loop (the pipeline's ``update`` and ``weights``): a copy of ``model`` whose
    every update moves ``lm_head`` by a step seeded by the update's number, so every version samples differently
    and the same versions are the same weights in every run."""

    def __init__(self, model: GptOssForCausalLM) -> None:
        self.model = copy.deepcopy(model)
        self.updates = 0

    def update(self, trajectories: Sequence[Trajectory]) -> UpdateResult:
        self.updates += 1
        head = self.model.lm_head.weight
        step = torch.randn(head.shape, generator=torch.Generator().manual_seed(self.updates))
        with torch.no_grad():
            head.add_(0.5 * step)
        return UpdateResult({})

    def weights(self) -> dict[str, torch.Tensor]:
        return self.model.state_dict()


class Cursor:
    """A task source whose tasks are the integers in order (the sequential stream's shape)."""

    def __init__(self) -> None:
        self.cursor = 0

    def draw(self, step: int, n: int) -> list[int]:
        self.cursor += n
        return list(range(self.cursor - n, self.cursor))

    def state(self) -> dict[str, object]:
        return {"kind": "sequential", "cursor": self.cursor}
