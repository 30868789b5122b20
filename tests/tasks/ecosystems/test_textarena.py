"""The TextArena adapter against the real package (harmonyrl[textarena]): a single-player game played through the
``move`` tool end to end, token-exact, and the games it cannot run refused in one line."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

import pytest

from fakes import ScriptedEngine
from harmonyrl.envs.checker import check_env, errors
from harmonyrl.envs.loader import UserCodeError
from harmonyrl.harmony.render import render_completion, render_training
from harmonyrl.harmony.tokenizer import HarmonyTokenizer
from harmonyrl.rollout.agent_loop import EpisodeLimits, initial_messages, run_episode
from harmonyrl.types import Message, SamplingParams

pytest.importorskip("textarena", reason="textarena is not installed (pip install 'harmonyrl[textarena]')")

from harmonyrl.tasks.ecosystems.textarena import TextArenaFactory

TOK = HarmonyTokenizer.load_default()
GAME = "GuessTheNumber-v0"


@pytest.fixture(scope="module")
def guess() -> TextArenaFactory:
    return TextArenaFactory(GAME, n_train=20, n_val=5, n_test=5)


def move(action: str) -> Message:
    args = json.dumps({"action": action})
    return Message("assistant", args, channel="commentary", recipient="functions.move", content_type="json")


def bisect_engine() -> ScriptedEngine:
    """Plays GuessTheNumber by bisection, reading the game's hints from the prompt (1..20)."""

    def script(prompt: Sequence[int]) -> list[int]:
        text = TOK.decode(prompt)
        lo, hi = 1, 20
        for guess_text, hint in zip(
            text.split("[Player] [")[1:], text.split("[GAME] The target number is ")[1:], strict=False
        ):
            g = int(guess_text.split("]")[0])
            lo, hi = (g + 1, hi) if hint.startswith("higher") else (lo, g - 1)
        return render_completion(TOK, [move(f"[{(lo + hi) // 2}]")])

    return ScriptedEngine(script)


def test_splits_are_disjoint_seeds(guess: TextArenaFactory) -> None:
    ids = [{t.prompt for t in guess.tasks(s)} for s in ("train", "validation", "test")]
    assert [len(i) for i in ids] == [20, 5, 5] and not (ids[0] & ids[1] or ids[0] & ids[2] or ids[1] & ids[2])


def test_a_won_game_is_reward_1_and_its_ids_are_the_sampled_ones(guess: TextArenaFactory) -> None:
    task = guess.tasks("test")[0]
    env = guess.make(task)
    params = SamplingParams(stop_ids=TOK.special.stop_ids)
    limits = EpisodeLimits(max_turns=8, max_new_tokens=32, max_seq_len=1024)
    traj = asyncio.run(run_episode(bisect_engine(), env, TOK, params, limits, task_id=task.id, group_id=0, seed=0))
    assert traj.reward == 1.0 and traj.terminated and traj.reward_terms["correct"] == 1.0
    assert traj.parity_mismatches == 0 and 1 <= traj.reward_terms["moves"] <= 5
    fresh = guess.make(task)
    messages = initial_messages(fresh, asyncio.run(fresh.reset()))
    for turn in traj.turns:
        messages += [*turn.sampled, *turn.observations]
    assert list(traj.token_ids) == render_training(TOK, messages)


def test_a_final_message_ends_an_unfinished_game_at_0(guess: TextArenaFactory) -> None:
    async def episode() -> tuple[str, float, float]:
        env = guess.make(guess.tasks("train")[0])
        await env.reset()
        bad = await env.step([move("[99]")])  # out of range: the game's own rule, an observation
        end = await env.step([Message("assistant", "7", channel="final")])
        return bad.observations[0].content, end.reward, end.info["format_error"]

    text, reward, format_error = asyncio.run(episode())
    assert "invalid move" in text.lower() and reward == 0.0 and format_error == 1.0


def test_the_factory_passes_check_env(guess: TextArenaFactory) -> None:
    assert errors(check_env(guess, n_tasks=2)) == []


@pytest.mark.parametrize(
    ("game", "message"),
    [
        ("NoSuchGame-v0", "is not a TextArena .* game"),
        ("TicTacToe-v0", "is not a single-player game: give env.opponent"),
        ("Wordle-v0", r"needs data downloaded at run time \(nltk .*\): refused"),
        # its module does not compile on Python 3.11 (PEP 701 f-strings); on 3.12 it is a two-player game
        ("Chess-v0", r"TextArena could not make it \(SyntaxError: |is not a single-player game"),
    ],
)
def test_what_cannot_run_here_is_refused_in_one_line(game: str, message: str) -> None:
    with pytest.raises(UserCodeError, match=message) as e:
        TextArenaFactory(game, n_train=2, n_val=1, n_test=1)
    assert "\n" not in str(e.value)


def test_the_run_config_builds_it() -> None:
    from harmonyrl.config import load_config
    from harmonyrl.tasks.factory import make_factory

    env = load_config(None, ["env.name=textarena", f"env.game={GAME}", "env.n_train=6", "env.n_test=2"]).env
    assert len(make_factory(env, seed=0).tasks("train")) == 6
