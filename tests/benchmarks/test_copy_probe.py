"""`benchmarks/copy_probe.py`: the teacher-forced count of number tokens right and of whole completions right, on
a hand-made demonstration and on a checkpoint folder's own held-out tasks (a perfect and a shifted fake model)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from benchmark_module import load_benchmark
from harmonyrl.config import dump_config, load_config
from harmonyrl.harmony.codecs import load_codec
from harmonyrl.trainer.checkpoint_files import RUN_CONFIG_FILE
from harmonyrl.trainer.sft import Demo

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "copy_probe.py"


bench = load_benchmark("copy_probe")


def test_tally_counts_written_number_tokens_and_whole_completions() -> None:
    # ids 5 7 | 123 9 123 written (mask 1); 123 is the number token. predicted[t] is the guess for ids[t + 1].
    demo = Demo(ids=(5, 7, 123, 9, 123), mask=(0, 0, 1, 1, 1))
    assert bench.tally([0, 123, 9, 123], demo, lambda i: i == 123) == (2, 2, True)
    assert bench.tally([0, 123, 9, 8], demo, lambda i: i == 123) == (1, 2, False)  # last number wrong
    assert bench.tally([0, 123, 8, 123], demo, lambda i: i == 123) == (2, 2, False)  # a non-number wrong
    assert bench.tally([123, 5, 9, 123], demo, lambda i: i == 123) == (1, 2, False)  # prompt guesses not scored


def test_probe_reads_the_checkpoints_env_and_scores_a_perfect_and_a_shifted_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = load_config(None, ["env.operand_values=10", "env.n_train=20", "env.n_test=6"])
    (tmp_path / RUN_CONFIG_FILE).write_text(dump_config(cfg))
    monkeypatch.setattr(bench, "load_model", lambda path: bench.torch.nn.Identity())
    seen: list[tuple[int, ...]] = []

    def perfect(model: object, ids: tuple[int, ...]) -> list[int]:
        seen.append(ids)
        return [*ids[1:], 0]

    monkeypatch.setattr(bench, "argmax_next", perfect)
    right, total, whole = bench.probe(tmp_path, 3, [])
    assert (right, whole) == (total, 3) and total >= 3 * 4  # each demo copies >= 2 operands twice + the answer
    monkeypatch.setattr(bench, "argmax_next", lambda model, ids: [-1] * len(ids))  # never right
    assert bench.probe(tmp_path, 3, []) == (0, total, 0)
    # the held-out tasks are the checkpoint's narrowed ones (operands 10..19, 100..109, 3..12)
    prompts = [load_codec(cfg.model.tokenizer).decode(list(ids)) for ids in seen]
    calls = [re.findall(r'"expression": "([^"]+)"', p) for p in prompts]
    assert [len(c) for c in calls] == [1, 1, 1]
    assert all(int(n) <= 109 for (expr,) in calls for n in re.findall(r"\d+", expr))


def test_main_takes_overrides_after_options_and_prints_the_result_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[tuple[Path, int, list[str]]] = []
    monkeypatch.setattr(bench, "probe", lambda ck, n, over: calls.append((ck, n, over)) or (3, 12, 1))
    monkeypatch.setattr(sys, "argv", ["copy_probe.py", "CK", "--n", "4", "seed=0"])
    bench.main()
    assert calls == [(Path("CK"), 4, ["seed=0"])]
    assert capsys.readouterr().out.strip() == "RESULT demos=4 number_tokens=12 numbers_right=0.250 all_right=1"
