"""`benchmarks/copy_probe.py`: the teacher-forced count of number tokens right (a number's first token apart from
the ones after it) and of whole completions right, on hand-made demonstrations and on a checkpoint folder's own
held-out tasks, calculator's and browse's (a perfect and a never-right fake model)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from benchmark_module import load_benchmark
from harmonyrl.config import dump_config, load_config
from harmonyrl.harmony.codecs import load_codec
from harmonyrl.run.checkpoint_files import RUN_CONFIG_FILE
from harmonyrl.sft.train import Demo

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "copy_probe.py"


bench = load_benchmark("copy_probe")


def test_tally_counts_written_number_tokens_and_whole_completions() -> None:
    # ids 5 7 | 123 9 123 written (mask 1); 123 is the number token. predicted[t] is the guess for ids[t + 1].
    demo = Demo(ids=(5, 7, 123, 9, 123), mask=(0, 0, 1, 1, 1))
    is_num = lambda i: i == 123  # noqa: E731
    assert bench.tally([0, 123, 9, 123], demo, is_num) == bench.Tally(2, 2, 0, 0, 1)
    assert bench.tally([0, 123, 9, 8], demo, is_num) == bench.Tally(1, 2, 0, 0, 0)  # last number wrong
    assert bench.tally([0, 123, 8, 123], demo, is_num) == bench.Tally(2, 2, 0, 0, 0)  # a non-number wrong
    assert bench.tally([123, 5, 9, 123], demo, is_num) == bench.Tally(1, 2, 0, 0, 0)  # prompt guesses not scored


def test_tally_tells_a_numbers_first_token_from_the_ones_after_it() -> None:
    # digits 1 6 2 6 (ids 1, 6, 2, 6) written after a tool result "1 6" (mask 0): the first written digit follows
    # an unwritten one, so it is a first token; a number split by a written non-number (9) starts again.
    digits = {1, 2, 6}
    demo = Demo(ids=(1, 6, 1, 6, 2, 6, 9, 2), mask=(0, 0, 1, 1, 1, 1, 1, 1))
    perfect = [*demo.ids[1:], 0]
    assert bench.tally(perfect, demo, digits.__contains__) == bench.Tally(2, 2, 3, 3, 1)
    copies_nothing_on = [6, 1, 9, 9, 9, 9, 2, 0]  # every first right, every later wrong
    assert bench.tally(copies_nothing_on, demo, digits.__contains__) == bench.Tally(2, 2, 0, 3, 0)
    total = bench.Tally(2, 2, 3, 3, 1) + bench.Tally(0, 2, 0, 3, 0)
    assert (total.right, total.total, total.all_right) == (5, 10, 1)


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
    t = bench.probe(tmp_path, 3, [])
    assert (t.right, t.all_right) == (t.total, 3) and t.firsts >= 3 * 4  # >= 2 operands copied twice + the answer
    monkeypatch.setattr(bench, "argmax_next", lambda model, ids: [-1] * len(ids))  # never right
    assert bench.probe(tmp_path, 3, []) == bench.Tally(0, t.firsts, 0, t.laters, 0)
    # the held-out tasks are the checkpoint's narrowed ones (operands 10..19, 100..109, 3..12)
    prompts = [load_codec(cfg.model.tokenizer).decode(list(ids)) for ids in seen]
    calls = [re.findall(r'"expression": "([^"]+)"', p) for p in prompts]
    assert [len(c) for c in calls] == [1, 1, 1]
    assert all(int(n) <= 109 for (expr,) in calls for n in re.findall(r"\d+", expr))


def test_main_takes_overrides_after_options_and_prints_the_result_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[tuple[Path, int, list[str]]] = []
    counts = bench.Tally(first_right=2, firsts=4, later_right=1, laters=8, all_right=1)
    monkeypatch.setattr(bench, "probe", lambda ck, n, over: calls.append((ck, n, over)) or counts)
    monkeypatch.setattr(sys, "argv", ["copy_probe.py", "CK", "--n", "4", "seed=0"])
    bench.main()
    assert calls == [(Path("CK"), 4, ["seed=0"])]
    assert capsys.readouterr().out.strip() == (
        "RESULT demos=4 number_tokens=12 numbers_right=0.250 first_right=0.500 later_right=0.125 all_right=1"
    )


def test_probe_of_a_browse_checkpoint_counts_the_numbers_of_its_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # browse writes numbers only in its answers (queries and page ids are names): one first token per number answer
    cfg = load_config(None, ["env.name=browse", "env.worlds=3", "env.n_train=30", "env.n_test=8"])
    (tmp_path / RUN_CONFIG_FILE).write_text(dump_config(cfg))
    monkeypatch.setattr(bench, "load_model", lambda path: bench.torch.nn.Identity())
    monkeypatch.setattr(bench, "argmax_next", lambda model, ids: [*ids[1:], 0])
    t = bench.probe(tmp_path, 8, [])
    tasks = bench.make_factory(cfg.env, cfg.seed).tasks("test")[:8]
    numbers = [task.answer for task in tasks if task.answer.isdigit()]
    assert 0 < len(numbers) < 8
    assert (t.firsts, t.laters, t.right, t.all_right) == (
        len(numbers),
        sum(map(len, numbers)) - len(numbers),
        t.total,
        8,
    )


def test_a_missing_checkpoint_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["copy_probe.py", str(tmp_path / "nowhere")])
    with pytest.raises(SystemExit) as exit_:
        bench.main()
    assert str(exit_.value).startswith("copy_probe: ") and "\n" not in str(exit_.value)
