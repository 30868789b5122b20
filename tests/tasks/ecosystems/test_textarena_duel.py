"""Two-player TextArena games against the real package (harmonyrl[textarena]): self-play with one shared policy on
both seats (the seated harness), a fixed random opponent, per-seat metrics, TextArena's own rules for invalid moves,
a forfeit, a game crash masked with its class, the scripted expert token-exact, and one-line refusals."""

from __future__ import annotations

import asyncio
import json
import random
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from fakes import ScriptedEngine
from harmonyrl.envs.base import Env
from harmonyrl.envs.checker import check_env, errors
from harmonyrl.envs.loader import UserCodeError
from harmonyrl.harmony.render import render_completion, render_training
from harmonyrl.harmony.tokenizer import HarmonyTokenizer
from harmonyrl.rollout.agent_loop import EpisodeLimits, initial_messages, run_episode
from harmonyrl.rollout.scheduler import group_requests
from harmonyrl.rollout.team import role_metrics, run_rollouts
from harmonyrl.types import ROLE_TERM, Message, SamplingParams, Task, Trajectory
from kill_resume import ENV, cli, killed_and_resumed, metric_rows, same_episodes
from tiny_run import tiny_run

pytest.importorskip("textarena", reason="textarena is not installed (pip install 'harmonyrl[textarena]')")

from harmonyrl.run.opponent import CheckpointPlayer
from harmonyrl.tasks.ecosystems.textarena_duel import DuelFactory, PlayerSeat, SelfPlayFactory
from harmonyrl.tasks.ecosystems.textarena_seats import SeatEnv, SeatPlayer

TOK = HarmonyTokenizer.load_default()
GAME = "TicTacToe-v0-train"
PARAMS = SamplingParams(stop_ids=TOK.special.stop_ids)
LIMITS = EpisodeLimits(max_turns=8, max_new_tokens=32, max_seq_len=2048, timeout_s=60)


def move(action: str) -> Message:
    args = json.dumps({"action": action})
    return Message("assistant", args, channel="commentary", recipient="functions.move", content_type="json")


def lowest_move_engine() -> ScriptedEngine:
    """Always plays the lowest cell the game lists as available (read from the prompt): a legal, scripted player."""

    def script(prompt: Sequence[int]) -> list[int]:
        lines = [line for line in TOK.decode(prompt).splitlines() if "Available Moves" in line]
        return render_completion(TOK, [move(re.findall(r"\[\d\]", lines[-1])[0])])

    return ScriptedEngine(script)


@pytest.fixture(scope="module")
def selfplay() -> SelfPlayFactory:
    return SelfPlayFactory(GAME, n_train=8, n_val=4, n_test=4)


@pytest.fixture(scope="module")
def duel() -> DuelFactory:
    return DuelFactory(GAME, n_train=8, n_val=4, n_test=4)


def test_self_play_runs_both_seats_at_once_each_with_its_own_outcome(selfplay: SelfPlayFactory) -> None:
    # lowest-cell play: X (seat 0) takes 0, 2, 4, 6 — the diagonal 2-4-6 wins on its 4th move
    requests = group_requests(selfplay.tasks("train")[:2], 2, 0)
    run = asyncio.run(run_rollouts(lowest_move_engine(), selfplay, TOK, requests, PARAMS, LIMITS, 8))
    assert len(run.trajectories) == 8  # 2 tasks × 2 games × 2 seats, request by request, seats in order
    for seat0, seat1 in zip(run.trajectories[::2], run.trajectories[1::2], strict=True):
        assert (seat0.reward_terms[ROLE_TERM], seat1.reward_terms[ROLE_TERM]) == (0.0, 1.0)
        assert seat0.group_id == seat1.group_id and seat0.failure is None and seat1.failure is None
        assert (seat0.reward, seat1.reward) == (1.0, 0.0)  # zero-sum: a win for one seat is the other's loss
        assert seat0.reward_terms["moves"] == 4.0 and seat1.reward_terms["moves"] == 3.0
        assert seat0.parity_mismatches == seat1.parity_mismatches == 0
        # each seat saw the other's moves: seat 1's first tool result names the cell seat 0 took next
        assert "in cell 2" in seat1.turns[0].observations[0].content
    metrics = role_metrics(selfplay, run.trajectories)
    assert metrics["team/seat0/win"] == 1.0 and metrics["team/seat1/loss"] == 1.0
    assert metrics["team/seat0/episodes"] == metrics["team/seat1/episodes"] == 4.0


def test_a_fixed_random_opponent_game_is_token_exact_and_tagged_with_its_seat(duel: DuelFactory) -> None:
    for task in duel.tasks("test")[:2]:
        seat = duel.role_of(task.id)
        traj = asyncio.run(run_episode(lowest_move_engine(), duel.make(task), TOK, PARAMS, LIMITS,
                                       task_id=task.id, group_id=0, seed=0))  # fmt: skip
        assert traj.terminated and traj.failure is None and traj.parity_mismatches == 0
        assert traj.reward_terms["seat"] == float(seat) and traj.reward in (0.0, 0.5, 1.0)
        assert traj.reward_terms["win"] + traj.reward_terms["draw"] + traj.reward_terms["loss"] == 1.0
        fresh = duel.make(task)
        messages = initial_messages(fresh, asyncio.run(fresh.reset()))
        for turn in traj.turns:
            messages += [*turn.sampled, *turn.observations]
        assert list(traj.token_ids) == render_training(TOK, messages)
    assert {duel.role_of(t.id) for t in duel.tasks("train")} == {0, 1}  # seed parity: both seats are played


def test_the_expert_demo_is_what_the_env_shows(duel: DuelFactory) -> None:
    """The demo's tool results are the env's own, move for move (the SFT warm start trains on what RL will see)."""
    for task in duel.tasks("train")[:4]:
        demo = duel.expert(task, random.Random(3))
        env = duel.make(task)

        async def replay(env: SeatEnv = env, demo: list[Message] = demo) -> list[str]:
            await env.reset()
            seen = []
            for m in demo:
                if m.recipient == "functions.move":
                    r = await env.step([m])
                    seen += [o.content for o in r.observations]
            return seen

        assert asyncio.run(replay()) == [m.content for m in demo if m.role == "tool"]
        assert demo[-1].recipient == "functions.move"  # it ends on the game-ending move, as the episode does


def test_two_invalid_moves_in_a_row_lose_by_the_game_s_rule() -> None:
    duel = DuelFactory("TicTacToe-v0", n_train=4, n_val=1, n_test=1)  # the default wrapper shows the warning
    task = next(t for t in duel.tasks("train") if duel.role_of(t.id) == 0)

    async def game() -> tuple[str, float, dict[str, float]]:
        env = duel.make(task)
        await env.reset()
        warned = await env.step([move("[42]")])  # out of range: TextArena warns, same seat moves again
        end = await env.step([move("nothing")])  # a second invalid move in a row: the game is lost
        await env.close()
        return warned.observations[0].content, end.reward, dict(end.info)

    warning, reward, info = asyncio.run(game())
    assert "invalid move" in warning.lower() and reward == 0.0
    assert info["loss"] == 1.0 and info["invalid_moves"] == 2.0 and info["format_error"] == 0.0


def test_a_seat_that_stops_moving_forfeits_and_the_other_seat_wins(selfplay: SelfPlayFactory) -> None:
    task = selfplay.tasks("train")[0]

    async def game() -> tuple[float, float, float]:
        seat0, seat1 = (f.make(task) for f in selfplay.table(task))

        async def first() -> float:
            await seat0.reset()
            end = await seat0.step([Message("assistant", "I resign.", channel="final")])
            await seat0.close()
            return end.reward

        async def second() -> tuple[float, float]:
            await seat1.reset()  # waits for seat 0, which answers instead of moving
            end = await seat1.step([move("[4]")])
            await seat1.close()
            return end.reward, end.info["opponent_forfeit"]

        r0, (r1, forfeit) = await asyncio.gather(first(), second())
        return r0, r1, forfeit

    assert asyncio.run(game()) == (0.0, 1.0, 1.0)


def test_a_game_crash_masks_every_seat_with_its_class(
    selfplay: SelfPlayFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    from harmonyrl.tasks.ecosystems import textarena_match

    real = textarena_match.Match.step

    def broken(self: textarena_match.Match, seat: int, action: str) -> None:
        if sum(self.env.state.game_info[s]["turn_count"] for s in (0, 1)) >= 2:
            raise KeyError("board")  # the game's own code failing on the third move
        real(self, seat, action)

    monkeypatch.setattr(textarena_match.Match, "step", broken)
    requests = group_requests(selfplay.tasks("train")[:1], 1, 0)
    run = asyncio.run(run_rollouts(lowest_move_engine(), selfplay, TOK, requests, PARAMS, LIMITS, 2))
    assert len(run.trajectories) == 2  # both seats masked with the game's exception class: nobody's 0
    for t in run.trajectories:
        assert t.failure is not None and "step raised KeyError" in t.failure.detail and t.reward == 0.0


def against_player(player: SeatPlayer) -> DuelFactory:
    return DuelFactory(GAME, "runs/opponent", n_train=8, n_val=4, n_test=4, player=player)


def play_seat(env: Env, task: Task) -> Trajectory:
    """The policy's episode at ``env`` (lowest-cell play), closed as the scheduler closes it."""

    async def play() -> Trajectory:
        try:
            return await run_episode(lowest_move_engine(), env, TOK, PARAMS, LIMITS, task_id=task.id, group_id=0,
                                     seed=0)  # fmt: skip
        finally:
            await env.close()

    return asyncio.run(asyncio.wait_for(play(), 60))


def test_a_checkpoint_opponent_plays_its_seat_as_an_episode_of_its_own() -> None:
    """The opponent's seat runs through the agent loop on its own engine (a scripted one here, as a checkpoint's
    would): the policy's trajectory is token-exact, shows the opponent's moves, and the game ends by its rules."""
    duel = against_player(CheckpointPlayer(lowest_move_engine(), TOK, 1.0, LIMITS))
    for task in duel.tasks("test")[:4]:
        seat = duel.role_of(task.id)
        env = duel.make(task)
        assert isinstance(env, PlayerSeat)
        traj = play_seat(env, task)
        assert traj.terminated and traj.failure is None and traj.parity_mismatches == 0
        # lowest-cell play on both seats: X (seat 0) wins on the 2-4-6 diagonal, as in self-play
        assert traj.reward == (1.0 if seat == 0 else 0.0) and traj.reward_terms["seat"] == float(seat)
        assert traj.reward_terms["opponent_forfeit"] == 0.0 and env.table.match.over
        assert traj.reward_terms["moves"] == (4.0 if seat == 0 else 3.0)
        if seat == 1:  # the opponent's moves, made by its own episode, come back as the tool's results
            assert "in cell 2" in traj.turns[0].observations[0].content
    assert {duel.role_of(t.id) for t in duel.tasks("test")[:4]} == {0, 1}


def test_an_opponent_that_raises_is_an_env_fault_and_one_that_stops_forfeits() -> None:
    async def raises(env: Env, seed: int) -> None:
        raise RuntimeError("engine fell over")

    async def stops(env: Env, seed: int) -> None:
        await env.reset()  # and never moves: its episode ends with the game unfinished

    crash = against_player(raises)
    task = next(t for t in crash.tasks("test") if crash.role_of(t.id) == 0)
    traj = play_seat(crash.make(task), task)
    assert traj.failure is not None and "the opponent raised RuntimeError: engine fell over" in traj.failure.detail
    quits = against_player(stops)
    traj = play_seat(quits.make(task), task)
    assert traj.failure is None and traj.reward == 1.0 and traj.reward_terms["opponent_forfeit"] == 1.0
    lister = DuelFactory(GAME, "runs/opponent", n_train=8, n_val=4, n_test=4)  # no player: tasks and tools only
    env = lister.make(task)
    assert [spec.name for spec in env.tools] == ["move"]
    with pytest.raises(RuntimeError, match="no player to play it"):
        asyncio.run(env.reset())


def test_a_checkpoint_opponent_is_checked_when_the_config_is_read(tmp_path: Path) -> None:
    from harmonyrl.config import load_config

    base = ["env.name=textarena", "env.game=TicTacToe-v0"]
    for overrides, message in (
        (["env.opponent=/no/such/ckpt"], "'/no/such/ckpt' is not a checkpoint folder"),
        ([f"env.opponent={tmp_path}"], "is not a checkpoint folder"),
        (["env.opponent=random", "env.opponent_temperature=0"], "opponent_temperature is a checkpoint opponent's"),
    ):
        with pytest.raises(Exception, match=message) as e:
            load_config(None, [*base, *overrides])
        assert "\n" not in str(e.value).strip().splitlines()[-1]


def test_both_factories_pass_check_env(selfplay: SelfPlayFactory, duel: DuelFactory) -> None:
    assert errors(check_env(duel, n_tasks=2)) == []
    assert errors(check_env(selfplay, n_tasks=2)) == []


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["env.game=NoSuchGame-v0", "env.opponent=random"], "is not a TextArena .* game"),
        (["env.game=Wordle-v0", "env.opponent=random"], r"needs data downloaded at run time \(nltk .*\): refused"),
        (["env.game=TicTacToe-v0"], "is a two-player game: set env.opponent to self .* random .* checkpoint folder"),
        (["env.game=GuessTheNumber-v0", "env.opponent=self"], "is a one-player game; leave it unset"),
        (["env.game=TicTacToe-v0", "env.opponent=greedy"], "'greedy' is not an opponent"),
        (["env.game=ThreePlayerTicTacToe-v0", "env.opponent=self"], "three or more players are not supported"),
    ],
)
def test_what_cannot_run_is_refused_in_one_line(overrides: list[str], message: str) -> None:
    from harmonyrl.config import load_config
    from harmonyrl.tasks.factory import make_factory

    env = load_config(None, ["env.name=textarena", "env.n_train=4", "env.n_val=2", "env.n_test=2", *overrides]).env
    with pytest.raises(UserCodeError, match=message) as e:
        make_factory(env, seed=0)
    assert "\n" not in str(e.value)


def nano_train(tmp_path: Path, *changes: str) -> list[dict[str, float]]:
    config = tiny_run("env.name=textarena", f"env.game={GAME}", "env.n_val=4", "rollout.max_seq_len=1024",
                      "eval.n_tasks=2", "eval.samples_per_task=1", "rl.skip_zero_variance_groups=false",
                      "rl.entropy_coef=0.01", "threads=1", *changes)  # fmt: skip
    cmd = [sys.executable, "-m", "harmonyrl.cli", "train", *config, f"output_dir={tmp_path}", "run_name=t"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return [json.loads(line) for line in (tmp_path / "t" / "metrics.jsonl").read_text().splitlines()]


def test_a_nano_self_play_run_trains_both_seats_and_logs_them_apart(tmp_path: Path) -> None:
    rows = nano_train(tmp_path, "env.opponent=self")
    rl = [r for r in rows if r["phase"] == "rl"]
    assert [r["step"] for r in rl] == [1, 2]
    for r in rl:  # 2 tasks × 2 games, each a seat-0 and a seat-1 trajectory, all trained on
        assert r["rollout/episodes"] == 8.0 and r["train/episodes"] == 8.0
        assert r["team/seat0/episodes"] == r["team/seat1/episodes"] == 4.0
    evals = [r for r in rows if r["phase"] == "eval"]
    assert len(evals) == 2 and all(r["eval_team/seat1/episodes"] == 2.0 for r in evals)


def test_a_nano_run_against_a_checkpoint_trains_one_seat_and_a_bad_folder_is_one_line(tmp_path: Path) -> None:
    nano_train(tmp_path / "a", "env.opponent=random")
    final = tmp_path / "a" / "t" / "checkpoints" / "final"
    rows = nano_train(tmp_path / "b", f"env.opponent={final}", "env.opponent_temperature=0.5")
    rl = [r for r in rows if r["phase"] == "rl"]
    assert [r["step"] for r in rl] == [1, 2]
    for r in rl:  # only the policy's seat is an episode of the run: the checkpoint's are thrown away
        assert r["rollout/episodes"] == 4.0 and r["team/seat0/episodes"] + r["team/seat1/episodes"] == 4.0
    assert "opponent_temperature: 0.5" in (tmp_path / "b" / "t" / "config.yaml").read_text()
    config = tiny_run("env.name=textarena", f"env.game={GAME}", f"env.opponent={tmp_path}", "threads=1")
    bad = subprocess.run([sys.executable, "-m", "harmonyrl.cli", "train", *config, f"output_dir={tmp_path / 'c'}"],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert bad.returncode != 0 and "not a checkpoint folder (no config.json inside)" in bad.stderr + bad.stdout
    assert "Traceback" not in bad.stderr + bad.stdout and not (tmp_path / "c").exists()


def test_a_nano_run_against_the_random_opponent_logs_each_seat(tmp_path: Path) -> None:
    rows = nano_train(tmp_path, "env.opponent=random")
    rl = [r for r in rows if r["phase"] == "rl"]
    assert [r["step"] for r in rl] == [1, 2]
    for r in rl:
        assert r["rollout/episodes"] == 4.0
        assert r["team/seat0/episodes"] + r["team/seat1/episodes"] == 4.0


@pytest.mark.slow
def test_a_run_against_a_checkpoint_killed_and_resumed_equals_the_uninterrupted_one(tmp_path: Path) -> None:
    """The opponent's moves are a function of the game's seed and what it saw: a resumed run replays them."""
    base = tiny_run(
        "env.name=textarena",
        f"env.game={GAME}",
        "env.n_val=4",
        "rollout.max_seq_len=1024",
        "eval.n_tasks=2",
        "eval.samples_per_task=1",
        "rl.skip_zero_variance_groups=false",
        "threads=1",
    )
    # a warm start that makes moves: greedy always, sampled about half the time (measured; nano, 100 SFT steps)
    warm = [*base, "env.opponent=random", "sft.steps=100", "sft.lr=3e-3", "sft.batch_size=8", "rl.steps=0"]
    subprocess.run(cli("train", *warm, f"output_dir={tmp_path}", "run_name=warm"), check=True, capture_output=True,
                   timeout=900)  # fmt: skip
    checkpoint = tmp_path / "warm" / "checkpoints" / "sft"
    config = [*base, f"env.opponent={checkpoint}", "env.opponent_temperature=0", f"model.init_from={checkpoint}",
              "sft.steps=0", "rl.steps=4"]  # fmt: skip
    subprocess.run(cli("train", *config, f"output_dir={tmp_path}", "run_name=whole"), env=ENV, check=True,
                   capture_output=True, timeout=600)  # fmt: skip
    killed_and_resumed([*config, f"output_dir={tmp_path}", "run_name=cut"], tmp_path / "cut")
    assert metric_rows(tmp_path / "cut") == metric_rows(tmp_path / "whole")
    assert same_episodes(tmp_path / "cut", tmp_path / "whole")
    episodes = (tmp_path / "cut" / "rollouts" / "episodes.jsonl").read_text()
    moves = [json.loads(line)["reward_terms"].get("moves", 0.0) for line in episodes.splitlines()]
    assert any(m > 0 for m in moves), "no move was made: the games did not exercise the opponent"
