"""``harmonyrl rm pairs``: two episodes of a task become a ranked pair, a tie is dropped and counted."""

from __future__ import annotations

from pathlib import Path

from harmonyrl.config import load_config
from harmonyrl.harmony.codecs import load_codec
from harmonyrl.jobs.rm_pairs import generate_pairs, pair_row
from harmonyrl.models.tiny_gpt_oss import build_config, build_model, save_model
from harmonyrl.rewards.pair_files import read_pairs
from harmonyrl.types import Message, Task, Trajectory, Turn


def _episode(answer: str, met: float) -> Trajectory:
    turn = Turn((Message(role="assistant", channel="final", content=answer),), None, (), 0.0, 0.0)
    return Trajectory("t", 0, (1,), (1,), (0.0,), 0.0, True, False, None, (turn,),
                      reward_terms={"constraints_met": met})  # fmt: skip


def test_pair_row_ranks_by_constraints_met() -> None:
    task = Task("t", "Describe the sea.\nDo not use any commas.", "ref", "train")
    row = pair_row(task, _episode("worse, answer", 0.0), _episode("better answer", 1.0))
    assert row is not None and row["chosen"] == "better answer" and row["rejected"] == "worse, answer"
    assert (row["chosen_met"], row["rejected_met"]) == (1.0, 0.0)
    assert pair_row(task, _episode("a", 0.5), _episode("b", 0.5)) is None  # a tie says nothing


def test_generate_pairs_counts_every_prompt(tmp_path: Path) -> None:
    tok = load_codec("harmonyrl_bpe")
    ckpt = tmp_path / "ckpt"
    save_model(build_model(build_config("nano", tok.vocab_size, tok.special.endoftext, tok.special.return_), 0), ckpt)
    cfg = load_config(None, ["env.name=instruct", "env.n_train=8", "env.n_test=2", "threads=1",
                             "rollout.max_new_tokens=16"])  # fmt: skip
    import asyncio

    stats = asyncio.run(generate_pairs(cfg, ckpt, 6, tmp_path / "pairs.jsonl"))
    assert stats.prompts == 6 and stats.pairs + stats.ties + stats.failed == 6
    written = (tmp_path / "pairs.jsonl").read_text().splitlines()
    assert len(written) == stats.pairs
    if stats.pairs:
        assert len(read_pairs(tmp_path / "pairs.jsonl").pairs) == stats.pairs


def test_a_team_env_is_refused_in_one_line(tmp_path: Path) -> None:
    """Pairs are one agent's episodes: on a team env run_episodes would play only the planner."""
    from typer.testing import CliRunner

    from harmonyrl.cli import app

    out = tmp_path / "p.jsonl"
    args = ["rm", "pairs", "--checkpoint", str(tmp_path / "none"), "--out", str(out), "env.name=relay"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code != 0 and "env.name=relay is a team env" in result.output, result.output
    assert not (tmp_path / "p.jsonl").exists()
