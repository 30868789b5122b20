"""What a demonstrations file gave, said once: a summary line for the console, every issue in the run folder
(``demos_report.jsonl``), and a one-line error when nothing in the file is usable, naming a report kept outside
the run folder (which a run that fails before its first step removes)."""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from pathlib import Path

from rich.console import Console

from harmonyrl.config import RunConfig
from harmonyrl.envs.base import EnvFactory
from harmonyrl.errors import DemoFileError
from harmonyrl.harmony.tokenizer import Codec
from harmonyrl.sft.demos import DemoIssue, FileDemos, load_demos
from harmonyrl.sft.train import Demo

REPORT_FILE = "demos_report.jsonl"
SHOWN = 5
"""Line numbers shown per cause in the summary; the report file has them all."""

_NOTES = {
    "prompt_differs": "with a prompt unlike the env's, trained on the env's",
    "tool_mismatch": "kept with a tool result unlike the env's, as sft.demos_on_mismatch=keep says",
    "unverified": "unverified, without a task_id to replay their tool calls against",
}


def _cause(issue: DemoIssue) -> str:
    """The summary's name for why a row was skipped."""
    match issue.kind:
        case "invalid":
            return "invalid JSON" if issue.detail.startswith("invalid JSON") else "schema error"
        case "unknown_tool":
            return issue.detail
        case "too_long":
            return "too long"
        case "tool_mismatch":
            return "tool result unlike the env's"
        case "unknown_task":
            return "unknown task_id"
        case _:
            return "held-out task_id"


def _where(issues: list[DemoIssue]) -> str:
    unit = issues[0].unit + ("s" if len(issues) > 1 else "")
    numbers = [str(i.number) for i in issues[:SHOWN]] + (["…"] if len(issues) > SHOWN else [])
    return f"{unit} {', '.join(numbers)}"


def _grouped(issues: list[DemoIssue], name: dict[str, str] | None = None) -> list[str]:
    groups: dict[str, list[DemoIssue]] = {}
    for issue in issues:
        groups.setdefault(name[issue.kind] if name else _cause(issue), []).append(issue)
    return [f"{len(g)} {cause} ({_where(g)})" for cause, g in sorted(groups.items(), key=lambda kv: -len(kv[1]))]


def summary(loaded: FileDemos) -> str:
    """``demos: 480 used, 12 skipped: 7 too long (lines 3, 9), 5 unknown tool 'functions.foo' (line 4, …)``,
    then the rows used despite a note (prompt unlike the env's, unverified tool calls)."""
    skipped = [i for i in loaded.issues if i.skipped]
    line = f"demos: {len(loaded.demos)} used, {len(skipped)} skipped"
    if skipped:
        line += ": " + ", ".join(_grouped(skipped))
    skipped_rows = {(i.unit, i.number) for i in skipped}
    notes = [i for i in loaded.issues if not i.skipped and (i.unit, i.number) not in skipped_rows]
    notes = list({(i.number, i.kind): i for i in notes}.values())  # a row counts once per kind of note
    if notes:
        line += "; " + ", ".join(_grouped(notes, _NOTES))
    return line


def write_report(loaded: FileDemos, path: Path) -> None:
    """Every issue, one JSON object a line (file, unit, number, kind, detail, skipped)."""
    path.write_text("".join(json.dumps(dataclasses.asdict(i)) + "\n" for i in loaded.issues))


def usable_or_fail(loaded: FileDemos) -> None:
    """A one-line ``DemoFileError`` when the file gave no demonstration at all. Its report is then kept in a file
    of its own outside the run folder, named in the message: a run that fails before its first step removes its
    folder, and the report in it with it."""
    if loaded.demos:
        return
    if loaded.rows == 0:
        raise DemoFileError(f"sft.demos: '{loaded.file}' holds no conversation")
    fd, name = tempfile.mkstemp(prefix="harmonyrl-demos-report-", suffix=".jsonl")
    os.close(fd)
    write_report(loaded, Path(name))
    raise DemoFileError(
        f"sft.demos: no usable demonstration in '{loaded.file}': {summary(loaded)}; every issue in {name}"
    )


async def demos_from_file(
    codec: Codec, factory: EnvFactory, config: RunConfig, run_dir: Path | None
) -> tuple[list[Demo], int]:
    """``sft.demos`` loaded, summarised on the console and reported into ``run_dir``: (demos, rows skipped)."""
    assert config.sft.demos is not None
    loaded = await load_demos(
        codec, factory, config.sft.demos, config.rollout.max_seq_len, config.sft.demos_on_mismatch
    )
    report = run_dir / REPORT_FILE if run_dir is not None else None
    usable_or_fail(loaded)
    if report is not None:
        write_report(loaded, report)
    where = f"  (every issue: {report})" if report is not None and loaded.issues else ""
    Console(highlight=False, soft_wrap=True).print(summary(loaded) + where, markup=False)
    return loaded.demos, loaded.skipped
