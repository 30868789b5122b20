"""``reward.judge.server``: a judge on a vLLM server of its own (a fake server here: httpx.MockTransport), checked
before any work, asked for every verdict, never sent the policy's weights, closed with the run's rewarder."""

from __future__ import annotations

import asyncio
import functools
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from harmonyrl.config import ConfigError, load_config
from harmonyrl.engine.vllm import VllmEngine
from harmonyrl.harmony.codecs import load_codec
from harmonyrl.harmony.render import render_completion
from harmonyrl.rl import reward_setup
from harmonyrl.tasks.factory import make_factory
from harmonyrl.types import Message, Trajectory, Turn

TOK = load_codec("harmonyrl_bpe")
SERVER = ["reward.judge.server.url=http://judge.test", "reward.judge.server.model=judge"]


def test_the_judge_server_keeps_its_own_weights_and_excludes_a_checkpoint(tmp_path: Path) -> None:
    cfg = load_config(None, ["env.name=instruct", *SERVER, "reward.judge.server.weight_sync=none"])
    assert cfg.reward.judge is not None and cfg.reward.judge.server is not None
    assert cfg.reward.judge.server.url == "http://judge.test"
    with pytest.raises(ConfigError, match=r"reward\.judge\.server\.weight_sync must be none"):
        load_config(None, ["env.name=instruct", *SERVER])  # the default 'reload' would send it the policy
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"give checkpoint .* or server .*, not both"):
        load_config(None, ["env.name=instruct", *SERVER, "reward.judge.server.weight_sync=none",
                           f"reward.judge.checkpoint={tmp_path}"])  # fmt: skip


def test_verdicts_come_from_the_judge_server(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[dict[str, Any]] = []
    verdict = render_completion(TOK, [Message(role="assistant", channel="final", content="8")])

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        sent.append(body)
        assert request.url.host == "judge.test" and request.url.path == "/inference/v1/generate"
        content = [{"token_id": t, "logprob": -0.1} for t in verdict]
        choice = {"token_ids": verdict, "logprobs": {"content": content}, "weight_versions": []}
        return httpx.Response(200, json={"choices": [choice]})

    checked: list[tuple[str, object]] = []
    monkeypatch.setattr(reward_setup, "check_server", lambda server, shape, n: checked.append((server.url, shape)))
    transport = httpx.MockTransport(handler)
    monkeypatch.setattr(reward_setup, "VllmEngine", functools.partial(VllmEngine, transport=transport))
    cfg = load_config(None, ["env.name=instruct", "env.n_train=4", "env.n_test=2", *SERVER,
                             "reward.judge.server.weight_sync=none"])  # fmt: skip
    factory = make_factory(cfg.env, cfg.seed)
    task = factory.tasks("train")[0]

    async def go() -> tuple[float, float]:
        policy: Any = object()  # never asked: the judge has its own server
        run = await reward_setup.make_rewarder(cfg, TOK, factory, policy)
        assert run is not None and isinstance(run.own_engine, VllmEngine)
        turn = Turn((Message(role="assistant", channel="final", content="The sea is calm."),), None, (), 0.0, 0.0)
        episode = Trajectory(task.id, 0, (1,), (1,), (0.0,), 1.0, True, False, None, (turn,),
                             reward_terms={"correct": 1.0})  # fmt: skip
        [scored], _ = await run.rewarder.apply([episode])
        await run.close()
        return scored.reward_terms["reward/judge"], scored.reward

    judged, reward = asyncio.run(go())
    assert checked == [("http://judge.test", None)]  # checked before any verdict, any model shape
    assert judged == pytest.approx(0.8) and reward == pytest.approx(1.0 + 0.8)
    assert len(sent) == 1 and sent[0]["model"] == "judge"
    assert TOK.decode(sent[0]["token_ids"]).count("The sea is calm.") == 1  # the answer is what it judges
