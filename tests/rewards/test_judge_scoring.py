"""The judge: scores parsed from its final message, parse failures masked (never 0), verdicts cached; the
rewarder composes the env's reward with the judged and learned terms and logs each one."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from fakes import ScriptedEngine
from harmonyrl.harmony.codecs import load_codec
from harmonyrl.harmony.render import render_completion
from harmonyrl.rewards.config import JudgeConfig, RewardConfig
from harmonyrl.rewards.judge import Judge, JudgeFailure, parse_verdict
from harmonyrl.rewards.scoring import Rewarder
from harmonyrl.types import Message, Trajectory, Turn

TOK = load_codec("harmonyrl_bpe")


def _final(text: str) -> list[int]:
    return render_completion(TOK, [Message(role="assistant", channel="final", content=text)])


@pytest.mark.parametrize(("reply", "score"), [("7", 0.7), ("Score: 10/10", 1.0), ("0", 0.0), ("2.5", 0.25)])
def test_parse_scores(reply: str, score: float) -> None:
    assert parse_verdict(TOK, _final(reply), 10) == pytest.approx(score)


def test_parse_failures_are_typed() -> None:
    assert parse_verdict(TOK, _final("great answer"), 10) == JudgeFailure("no_score", "great answer")
    got = parse_verdict(TOK, _final("11"), 10)
    assert isinstance(got, JudgeFailure) and got.kind == "out_of_range"
    analysis = render_completion(TOK, [Message(role="assistant", channel="analysis", content="7")])
    got = parse_verdict(TOK, analysis, 10)
    assert isinstance(got, JudgeFailure) and got.kind == "no_final"  # a score on analysis is not a verdict
    assert isinstance(parse_verdict(TOK, TOK.encode("7 out of"), 10), JudgeFailure)  # cut off mid-header


def _answer_engine() -> ScriptedEngine:
    """A judge that gives 9 to answers mentioning waves, a scoreless reply to 'broken', else 2."""

    def script(prompt: Sequence[int]) -> list[int]:
        text = TOK.decode(prompt)
        answer = text.rsplit("Answer:\n", 1)[1]
        return _final("I cannot say" if "broken" in answer else "9" if "waves" in answer else "2")

    return ScriptedEngine(script)


def test_judge_caches_repeats() -> None:
    engine = _answer_engine()
    judge = Judge(engine, TOK, JudgeConfig())

    async def go() -> list[float | None]:
        a = await judge.judge("Describe the sea.", "waves")
        b = await judge.judge("Describe the sea.", "waves")
        c = await judge.judge("Describe the sea.", "sand")
        assert a.tokens > 0 and b.tokens == 0 and b.cached and not a.cached
        return [a.score, b.score, c.score]

    assert asyncio.run(go()) == [0.9, 0.9, 0.2]
    assert len(engine.prompts) == 2 and judge.hits == 1


def _episode(group: int, answer: str, reward: float, met: float) -> Trajectory:
    turn = Turn((Message(role="assistant", channel="final", content=answer),), None, (), 0.0, 0.0)
    return Trajectory("t1", group, (1,), (1,), (0.0,), reward, True, False, None, (turn,),
                      reward_terms={"correct": reward, "constraints_met": met})  # fmt: skip


def test_rewarder_composes_judge_and_masks_failures() -> None:
    cfg = RewardConfig(env_weight=0.5, judge=JudgeConfig(weight=2.0))
    rewarder = Rewarder(cfg, TOK, {"t1": "Describe the sea."}, judge=Judge(_answer_engine(), TOK, cfg.judge))
    episodes = [_episode(0, "waves", 1.0, 1.0), _episode(0, "sand", 0.0, 0.5), _episode(0, "broken", 0.0, 0.0)]
    out, metrics = asyncio.run(rewarder.apply(episodes))
    # env 0.5·1 + judge 2·0.9 = 2.3; env 0 + judge 2·0.2 = 0.4; the scoreless verdict masks the third, not 0
    assert [t.reward for t in out[:2]] == pytest.approx([2.3, 0.4])
    assert out[0].reward_terms["reward/judge"] == pytest.approx(1.8) and out[0].reward_terms["reward/env"] == 0.5
    assert out[2].failure is not None and out[2].failure.kind == "reward_error" and out[2].reward == 0.0
    assert "no_score" in out[2].failure.detail
    assert metrics["judge/parse_failures"] == 1.0 and metrics["judge/failure_no_score"] == 1.0
    assert metrics["reward/judge"] == pytest.approx((1.8 + 0.4) / 2)  # a masked verdict is not averaged as 0
    assert metrics["reward/env"] == pytest.approx(0.5 / 3)  # the masked episode keeps its env term
    assert metrics["reward/judge_agreement"] == 1.0  # ranks the two unmasked episodes as the checkers do
    assert metrics["judge/tokens_per_episode"] > 0


def test_rewarder_adds_reward_model_term() -> None:
    from harmonyrl.models.tiny_gpt_oss import build_config, build_model
    from harmonyrl.rewards.model import RewardModel

    lm = build_model(build_config("nano", TOK.vocab_size, TOK.special.endoftext, TOK.special.return_), seed=0)
    rm = RewardModel(lm, "harmonyrl_bpe", 256)
    cfg = RewardConfig(model_weight=0.5)
    rewarder = Rewarder(cfg, TOK, {"t1": "Describe the sea."}, model=rm)
    episodes = [_episode(0, "waves", 1.0, 1.0), _episode(1, "sand", 0.0, 0.5)]
    out, metrics = asyncio.run(rewarder.apply(episodes))
    from harmonyrl.rewards.episodes import answer_messages, prompt_messages
    from harmonyrl.rewards.model import answer_ids

    raw = rm.score([answer_ids(TOK, prompt_messages("Describe the sea."), answer_messages("waves"), 256)])[0]
    assert out[0].reward == pytest.approx(1.0 + 0.5 * raw, abs=1e-5)
    assert out[0].reward_terms["reward/model"] == pytest.approx(0.5 * raw, abs=1e-5)
    assert "rm/seconds" in metrics and "reward/model" in metrics
