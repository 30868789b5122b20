"""Output sent to a file (``harmonyrl … > log``): no line wrapped at 80 columns, no table cell cut to ``…``.

Each command runs in a subprocess with its stdout a file, as a user's redirected run is, and ``COLUMNS`` unset.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from harmonyrl import preset_files
from tiny_run import tiny_run


def run_to_file(tmp_path: Path, *args: str) -> list[str]:
    """The lines ``harmonyrl ARGS`` writes to a file (stdout and stderr together); it must exit 0."""
    out = tmp_path / "out.txt"
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "TERMINAL_WIDTH")}
    with out.open("w") as f:
        done = subprocess.run(
            [sys.executable, "-m", "harmonyrl.cli", *args], stdout=f, stderr=subprocess.STDOUT, env=env
        )
    text = out.read_text()
    assert done.returncode == 0, text
    assert "…" not in text  # rich's mark for a cut cell or line
    return text.splitlines()


def test_the_main_commands_lines_are_whole_in_a_file(tmp_path: Path) -> None:
    lines = run_to_file(tmp_path, "train", *tiny_run(), f"output_dir={tmp_path}", "run_name=r")
    first = lines[0]
    assert first.startswith(f"run folder {tmp_path / 'r'}") and first.rstrip().endswith(")"), first  # engine (isa)
    summary = [line for line in lines if line.startswith("held-out pass@1: ")]
    assert len(summary) == 1 and summary[0].rstrip().endswith(f"({tmp_path / 'r'})"), lines
    warned = [line for line in lines if line.startswith("warning: RL: ")]
    assert warned and all(line.rstrip().endswith("see train/skipped)") for line in warned), lines
    assert max(map(len, lines)) > 100  # long lines exist, and were not broken at 80
    shown = run_to_file(tmp_path, "show", str(tmp_path / "r"), "--step", "1", "--limit", "2")
    prompts = [line for line in shown if "prompt: " in line]
    answers = [line for line in shown if "expected answer: " in line]
    assert len(prompts) == len(answers) == 2, shown  # the calculator's tasks all have an expected answer
    assert all(len(line) < 400 for line in shown)  # panels fit their text, not the unlimited width


def test_presets_print_whole_descriptions_in_a_file(tmp_path: Path) -> None:
    lines = run_to_file(tmp_path, "presets")
    for preset in preset_files.available():
        assert f"{preset.name:<12} {preset.description}" in lines
    assert any(len(line) > 120 for line in lines)


def test_compare_table_is_whole_in_a_file(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    args = ["compare", "--algos", "grpo,sac", "--out", str(out), "--target", "0.0", *tiny_run("rl.steps=1")]
    lines = run_to_file(tmp_path, *args)
    data = json.loads((out / "compare.json").read_text())
    header = next(line for line in lines if line.startswith("┃ algo"))
    rows = [line for line in lines if line.startswith("│") and line.split("│")[1].strip() in ("grpo", "sac")]
    assert len(rows) == 2 and all(len(row) == len(header) for row in rows), lines
    markdown_header = (out / "compare.md").read_text().splitlines()
    columns = next(line for line in markdown_header if line.startswith("| algo"))
    for column in (c.strip() for c in columns.strip("|").split("|")):
        assert column in header, column  # every column of compare.md, named whole
    assert [r["algo"] for r in data["results"]] == ["grpo", "sac"]
    assert any(line.startswith("── SFT warm start, seed 0 ──") for line in lines)
    # both arms at 0 % on a 4-task evaluation: the table ranks nothing, and says so, on the console and in compare.md
    [note] = [line for line in lines if line.startswith("note: the arms cannot be ranked at this budget")]
    assert note in (out / "compare.md").read_text()


def test_arms_apart_by_more_than_the_noise_are_ranked_without_a_note() -> None:
    from harmonyrl.config import load_config
    from harmonyrl.jobs.compare import AlgoResult, ranking_note

    def arm(name: str, final: float) -> AlgoResult:
        return AlgoResult(name, 1, None, None, final, final, final, 1.0, 0.0, 1.0, [], 0.01, 0.01)

    config = load_config(None, ["eval.n_tasks=100", "eval.samples_per_task=4"])  # 400 samples per arm: ±~7 %
    assert ranking_note([arm("grpo", 0.30), arm("ppo", 0.55)], config, seeds=1) is None
    tie = ranking_note([arm("grpo", 0.30), arm("ppo", 0.33)], config, seeds=1)
    assert tie is not None and "spans 30.0%-33.0%, within the noise of 400 held-out samples per arm" in tie


def test_help_in_a_file_shows_whole_defaults(tmp_path: Path) -> None:
    lines = run_to_file(tmp_path, "compare", "--help")
    [algos] = [line for line in lines if line.lstrip().startswith("--algos")]
    assert algos.rstrip().endswith("[default: ppo,grpo,rloo,reinforce_pp,gspo,sac]"), lines
    assert not any(set(line.strip()) <= set("─╭╮╰╯│ ") and line.strip() for line in lines)  # no panel borders
    commands = run_to_file(tmp_path, "--help")
    [check] = [line for line in commands if line.lstrip().startswith("check-env")]
    assert check.rstrip().endswith("are shown but do not fail it)."), commands  # whole, not cut at 80 or "e.g."
