"""The report says why update curves are missing: RL steps that applied no update."""

from __future__ import annotations

import json
from pathlib import Path

from harmonyrl.telemetry.report import update_note, write_report
from harmonyrl.telemetry.series import collect_series


def _rows(skipped: list[int], reward: float = 0.0) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for step, flag in enumerate(skipped, 1):
        row: dict[str, object] = {"step": step, "phase": "rl", "rollout/reward": reward, "train/skipped": float(flag)}
        row |= {"rollout/groups": 8.0, "rollout/equal_reward_groups": 8.0 if flag else 3.0}
        if not flag:
            row |= {"train/loss": 0.1, "train/entropy": 1.0, "train/grad_norm": 0.5, "train/kl_ref_k3": 0.0}
            row |= {"train/clip_fraction": 0.0, "guard/skipped": 0.0}
        rows.append(row)
    return rows


def test_every_step_skipped_is_explained_in_the_page(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows([1, 1, 1])))
    page = write_report(run).read_text()
    assert (
        "No update was applied in any of the 3 RL steps (train/skipped): every group&#x27;s episodes had equal "
        "rewards (mean rollout reward 0.00 on those steps) — the task may be too hard for the warm start."
    ) in page
    assert "Not recorded in this run: " in page and "KL divergence" in page  # the curves the note explains


def test_some_steps_skipped_and_guard_rollbacks() -> None:
    rows = _rows([1, 0, 1, 0], reward=0.25)
    rows[1]["guard/skipped"] = 1.0
    note = update_note(collect_series(rows))
    assert note is not None
    assert note.startswith("No update was applied in 2 of the 4 RL steps (train/skipped): every group's episodes")
    assert "(mean rollout reward 0.25 on those steps). The update curves" in note  # no "too hard" at reward > 0
    assert note.endswith("1 RL steps were rolled back by a stability guard (guard/skipped).")


def test_no_note_when_every_step_updated() -> None:
    assert update_note(collect_series(_rows([0, 0]))) is None
    assert update_note(collect_series([{"step": 1, "phase": "rl", "rollout/reward": 0.5}])) is None
