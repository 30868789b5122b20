"""An episode's wall-clock budget reaches into the sandbox: the model's program and everything it started die."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import threading
import uuid
from collections.abc import Sequence

from sandbox_helpers import LIMITS, eventually, needs_bwrap, pids_with

from fakes import ScriptedEngine
from harmonyrl.envs.python_tool import make_python_tool
from harmonyrl.envs.tools import Toolbox
from harmonyrl.harmony.render import render_completion
from harmonyrl.harmony.tokenizer import HarmonyTokenizer
from harmonyrl.rollout.agent_loop import EpisodeLimits
from harmonyrl.rollout.scheduler import EpisodeRequest, run_episodes
from harmonyrl.tasks.calculator import CalculatorEnv, CalculatorFactory
from harmonyrl.types import Failure, Message, SamplingParams, Task

TOK = HarmonyTokenizer.load_default()
TASK = CalculatorFactory(seed=0, n_train=1, n_test=1).tasks("train")[0]


def one_call(code: str) -> ScriptedEngine:
    """An engine that calls the python tool with ``code`` (the episode never gets further)."""
    msg = Message("assistant", json.dumps({"code": code}), "commentary", "functions.python", content_type="json")
    ids = render_completion(TOK, [msg])
    return ScriptedEngine(lambda _prompt: ids)


class PythonFactory:
    name = "python"

    def __init__(self) -> None:
        self.toolbox = Toolbox([make_python_tool(dataclasses.replace(LIMITS, timeout_s=60))])

    def tasks(self, split: str) -> Sequence[Task]:
        return [TASK]

    def make(self, task: Task) -> CalculatorEnv:
        return CalculatorEnv(task, self.toolbox)


@needs_bwrap
def test_expired_budget_kills_the_running_sandbox_and_its_detached_children() -> None:
    token = f"{os.getpid()}.{uuid.uuid4().int % 10**6:06d}"  # `sleep 1234.567890`: findable on the host
    code = f"""
import os
if os.fork() == 0:
    os.setsid()  # a grandchild in its own session
    os.execv("/usr/bin/sleep", ["sleep", "{token}1"])
os.execv("/usr/bin/sleep", ["sleep", "{token}2"])
"""
    seen = threading.Event()  # the sandboxed sleeps were running while the episode was
    watcher = threading.Thread(target=lambda: eventually(lambda: len(pids_with(token)) == 2) and seen.set())
    watcher.start()
    limits = EpisodeLimits(max_turns=2, max_new_tokens=256, max_seq_len=1024, timeout_s=4.0)
    params = SamplingParams(stop_ids=TOK.special.stop_ids)
    request = EpisodeRequest(TASK, 0, 0)
    out = asyncio.run(run_episodes(one_call(code), PythonFactory(), TOK, [request], params, limits, 1))  # type: ignore[arg-type]
    watcher.join()
    assert seen.is_set(), "the sandboxed sleeps never started"
    assert out.trajectories[0].failure == Failure("episode_timeout", "exceeded its 4 s wall-clock budget")
    assert eventually(lambda: not pids_with(token), 3.0), f"survivors: {pids_with(token)}"
