"""``sft.demos``: demonstrations from JSONL, parquet and datasets folders render exactly as the expert path's, and
every row that cannot be used is reported by line with its cause, never dropped silently."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from harmonyrl.config import load_config
from harmonyrl.errors import DemoFileError
from harmonyrl.harmony.demo_schema import DemoConversation
from harmonyrl.harmony.render import render_completion
from harmonyrl.harmony.tokenizer import HarmonyTokenizer
from harmonyrl.jobs.export_demos import export_expert_demos
from harmonyrl.sft.demo_report import summary
from harmonyrl.sft.demos import FileDemos, load_demos
from harmonyrl.sft.train import Demo, build_demos
from harmonyrl.tasks.calculator import CalculatorFactory, expert_demo

TOK = HarmonyTokenizer.load_default()
SEED = 0
N_TASKS = 12  # sft.steps=3 x sft.batch_size=4
CONFIG = ["sft.steps=3", "sft.batch_size=4", "env.n_train=32", "env.n_test=4", f"seed={SEED}"]


def _factory() -> CalculatorFactory:
    return CalculatorFactory(SEED, n_train=32, n_test=4)


def _expert_path() -> list[Demo]:
    """What run_sft builds without sft.demos, for the same config."""
    env = load_config(None, CONFIG).env
    factory = _factory()
    tasks = factory.tasks("train")[:N_TASKS]
    fn = lambda t, r: expert_demo(t, r, env.p_tool, env.p_verbose)  # noqa: E731
    return asyncio.run(build_demos(TOK, factory, fn, tasks, SEED))


def _export(path: Path) -> list[dict[str, object]]:
    assert asyncio.run(export_expert_demos(load_config(None, CONFIG), path)) == N_TASKS
    return [json.loads(line) for line in path.read_text().splitlines()]


def _load(path: Path, max_seq_len: int = 512, on_mismatch: str = "drop") -> FileDemos:
    return asyncio.run(load_demos(TOK, _factory(), path, max_seq_len, on_mismatch))  # type: ignore[arg-type]


def _write_jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _has_tool_call(row: dict[str, object]) -> bool:
    return any(m.get("recipient", "").startswith("functions.") for m in row["messages"])  # type: ignore[union-attr, attr-defined]


def test_expert_file_round_trip_renders_the_expert_paths_ids_and_mask(tmp_path: Path) -> None:
    rows = _export(tmp_path / "demos.jsonl")
    assert all(DemoConversation.model_validate(r) for r in rows)  # the exported file is in the documented schema
    assert sum(map(_has_tool_call, rows)) >= 6  # p_tool=0.8 of 12: the replay is really exercised
    loaded = _load(tmp_path / "demos.jsonl")
    assert loaded.issues == []
    assert loaded.demos == _expert_path()  # ids and loss mask, demo for demo, in file order


def test_the_mask_is_one_exactly_on_the_assistants_tokens(tmp_path: Path) -> None:
    rows = _export(tmp_path / "demos.jsonl")
    n = next(i for i, r in enumerate(rows) if _has_tool_call(r))
    conv = DemoConversation.model_validate(rows[n])
    call, result, final = (m.to_message() for m in conv.messages[-3:])
    assert result.role == "tool"
    demo = _load(tmp_path / "demos.jsonl").demos[n]
    # by hand: the call ends its turn (<|call|>), the final answer is the next turn (ends <|return|>); the
    # prompt and the tool result between them are context (mask 0)
    sampled = render_completion(TOK, [call]) + render_completion(TOK, [final])
    assert [t for t, m in zip(demo.ids, demo.mask, strict=True) if m] == sampled
    assert demo.mask[-len(render_completion(TOK, [final])) - 1] == 0  # the turn header before the answer


def test_parquet_and_datasets_folders_give_the_same_demos(tmp_path: Path) -> None:
    import datasets

    rows = _export(tmp_path / "demos.jsonl")
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "demos.parquet")
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    extra = [{**r, "source": "expert"} for r in rows]  # a dataset's other columns are not read
    datasets.DatasetDict({"train": datasets.Dataset.from_list(extra)}).save_to_disk(str(tmp_path / "dsdict"))
    expert = _expert_path()
    for name in ("demos.parquet", "ds", "dsdict"):
        loaded = _load(tmp_path / name)
        assert (name, loaded.issues, loaded.demos) == (name, [], expert)


def test_a_demo_without_task_id_renders_from_its_own_messages_and_is_unverified(tmp_path: Path) -> None:
    rows = _export(tmp_path / "demos.jsonl")
    own = _write_jsonl(tmp_path / "own.jsonl", [{"messages": r["messages"]} for r in rows])
    loaded = _load(own)
    assert loaded.demos == _expert_path()  # its own full prompt is the env's
    unverified = [i.number for i in loaded.issues if i.kind == "unverified"]
    assert unverified == [n for n, r in enumerate(rows, 1) if _has_tool_call(r)]
    assert f"{len(unverified)} unverified" in summary(loaded)
    # without system and developer messages, the env's are put in front: the same tokens again
    bare = [{"messages": [m for m in r["messages"] if m["role"] not in ("system", "developer")]} for r in rows]  # type: ignore[union-attr]
    assert _load(_write_jsonl(tmp_path / "bare.jsonl", bare)).demos == _expert_path()


def test_bad_lines_are_counted_and_reported_by_line_number(tmp_path: Path) -> None:
    rows = _export(tmp_path / "demos.jsonl")
    call = next(r for r in rows if _has_tool_call(r))
    foo = json.loads(json.dumps(call).replace("functions.calculator", "functions.foo"))
    lines: list[object] = [
        rows[0],  # 1
        "{not json",  # 2
        {"messages": [{"role": "robot", "content": "x"}]},  # 3: schema
        "",  # 4: blank, not a row
        foo,  # 5: unknown tool
        {"task_id": "nope", "messages": rows[1]["messages"]},  # 6: unknown task
        {**rows[1], "task_id": _factory().tasks("test")[0].id},  # 7: a held-out task
        {"messages": [{"role": "user", "content": "hi"}]},  # 8: nothing to learn
        rows[1],  # 9
    ]
    loaded = _load(_write_jsonl(tmp_path / "bad.jsonl", lines))
    skipped = {(i.number, i.kind) for i in loaded.issues if i.skipped}
    assert skipped == {
        (2, "invalid"), (3, "invalid"), (5, "unknown_tool"), (6, "unknown_task"), (7, "held_out_task"), (8, "invalid")
    }  # fmt: skip
    assert (len(loaded.demos), loaded.skipped, loaded.rows) == (2, 6, 8)
    assert summary(loaded) == (
        "demos: 2 used, 6 skipped: 2 schema error (lines 3, 8), 1 invalid JSON (line 2), "
        "1 unknown tool 'functions.foo' (line 5), 1 unknown task_id (line 6), 1 held-out task_id (line 7)"
    )


def test_a_recorded_tool_result_unlike_the_envs_is_reported_and_dropped_kept_or_fatal(tmp_path: Path) -> None:
    rows = _export(tmp_path / "demos.jsonl")
    n = next(i for i, r in enumerate(rows) if _has_tool_call(r))
    tampered = json.loads(json.dumps(rows[n]))
    tool = next(m for m in tampered["messages"] if m["role"] == "tool")
    real = tool["content"]
    tool["content"] = '{"result": -1}'
    path = _write_jsonl(tmp_path / "tampered.jsonl", [*rows[:n], tampered, *rows[n + 1 :]])
    index = tampered["messages"].index(tool)

    dropped = _load(path)
    (issue,) = dropped.issues
    assert (issue.number, issue.kind, issue.skipped) == (n + 1, "tool_mismatch", True)
    assert issue.detail.startswith(f"message {index}: recorded ")
    assert '{"result": -1}' in issue.detail and real in issue.detail
    assert dropped.demos == [d for i, d in enumerate(_expert_path()) if i != n]

    kept = _load(path, on_mismatch="keep")
    assert [i.skipped for i in kept.issues] == [False]
    assert len(kept.demos) == N_TASKS and kept.demos[n] != _expert_path()[n]  # trained as recorded
    with pytest.raises(DemoFileError, match=f"tampered.jsonl line {n + 1}: message {index}: recorded"):
        _load(path, on_mismatch="error")


def test_a_prompt_unlike_the_envs_is_reported_and_the_envs_prompt_used(tmp_path: Path) -> None:
    rows = _export(tmp_path / "demos.jsonl")
    changed = json.loads(json.dumps(rows[0]))
    user = next(m for m in changed["messages"] if m["role"] == "user")
    user["content"] = "Evaluate 1 + 1."
    loaded = _load(_write_jsonl(tmp_path / "p.jsonl", [changed]))
    (issue,) = loaded.issues
    assert (issue.kind, issue.skipped) == ("prompt_differs", False)
    assert "Evaluate 1 + 1." in issue.detail
    assert loaded.demos == _expert_path()[:1]


def test_too_long_demos_are_reported_with_their_lines(tmp_path: Path) -> None:
    _export(tmp_path / "demos.jsonl")
    lengths = [len(d.ids) for d in _expert_path()]
    limit = sorted(lengths)[len(lengths) // 2]
    loaded = _load(tmp_path / "demos.jsonl", max_seq_len=limit)
    too_long = [i.number for i in loaded.issues if i.kind == "too_long"]
    assert too_long == [n for n, k in enumerate(lengths, 1) if k > limit] and too_long
    assert len(loaded.demos) == N_TASKS - len(too_long)
    assert f"{len(too_long)} too long (lines {too_long[0]}, " in summary(loaded)


def test_a_file_that_cannot_be_read_is_one_error(tmp_path: Path) -> None:
    with pytest.raises(DemoFileError, match="does not exist"):
        _load(tmp_path / "missing.jsonl")
    (tmp_path / "demos.csv").write_text("a,b\n")
    with pytest.raises(DemoFileError, match=r"expected a \.jsonl or \.parquet file"):
        _load(tmp_path / "demos.csv")
    pq.write_table(pa.Table.from_pylist([{"text": "hi"}]), tmp_path / "t.parquet")
    with pytest.raises(DemoFileError, match="has no 'messages' column \\(columns: text\\)"):
        _load(tmp_path / "t.parquet")
    (tmp_path / "broken.parquet").write_text("not parquet")
    with pytest.raises(DemoFileError, match="not a readable parquet file"):
        _load(tmp_path / "broken.parquet")
    (tmp_path / "folder").mkdir()
    with pytest.raises(DemoFileError, match="not a folder saved with datasets' save_to_disk"):
        _load(tmp_path / "folder")
