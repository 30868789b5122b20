"""``benchmarks/results.py`` on a tiny budget writes docs/results.json and docs/results.md and the README's table.

It runs one real benchmark (``vocab_cost``'s smoke mode, seconds) in a subprocess, records one that cannot run
(``sweep_presets``: it needs a finished sweep study) as not run with its reason, and keeps a finished run on a second
invocation (resumable). Nothing here is skipped: a missing file or figure fails the test.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmark_module import BENCHMARKS, load_benchmark

results = load_benchmark("results")


def _run(tmp_path: Path, *extra: str) -> str:
    cmd = [sys.executable, str(BENCHMARKS / "results.py"), "--budget", "tiny", "--only", "vocab_cost,sweep_presets",
           "--docs", str(tmp_path / "docs"), "--readme", str(tmp_path / "README.md"), "--logs", str(tmp_path / "logs"),
           *extra]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_results_on_a_tiny_budget_writes_both_files_and_the_readme_table(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text(f"# title\n\n{results.BEGIN}\nold table\n{results.END}\n\nafter\n")
    _run(tmp_path)
    data = json.loads((tmp_path / "docs" / "results.json").read_text())
    machine = data["machine"]
    assert machine["cores"] >= 1 and machine["cpu"] and len(machine["commit"]) == 40
    assert machine["packages"]["torch"]
    run = data["runs"]["vocab_cost"]
    assert run["status"] == "ok", run
    assert run["budget"] == "tiny"
    assert run["result"]["tokenizer"] == "harmonyrl_bpe" and run["result"]["params"]
    assert len(run["load_before"]) == 3 and run["load_during"]["samples"] >= 1
    assert data["runs"]["sweep_presets"]["status"].startswith("not run: needs a finished sweep study")
    md = (tmp_path / "docs" / "results.md").read_text()
    assert "| [vocab_cost](../benchmarks/vocab_cost.py) |" in md and run["result_line"] in md
    assert "| tiny (smoke) | ok |" in md and "**not** a measurement" in md
    readme = (tmp_path / "README.md").read_text()
    assert "old table" not in readme and readme.endswith("\n\nafter\n")
    assert "Smoke-tested only (tiny budget, no figures): vocab_cost." in readme
    assert "params=" not in readme  # a smoke run's figures are never shown as a result
    data["runs"]["vocab_cost"]["budget"] = "full"  # the same record as a measurement: a row with its figures
    table = results.readme_table(data)
    assert "| [vocab_cost](docs/results.md#vocab_cost) ([doc](docs/o200k.md)) | `params=" in table
    # resumable: the finished run is kept, not run again
    assert "vocab_cost: kept (tiny" in _run(tmp_path)


def test_parse_result_reads_the_last_result_line() -> None:
    text = "RESULT a=1\nnoise\nRESULT sync_min=0.66 speedup=1.81 final_gap_pp=0.7 (k=2) best=sac\n"
    line, figures = results.parse_result(text)
    assert line.startswith("RESULT sync_min=0.66")
    assert figures == {"sync_min": 0.66, "speedup": 1.81, "final_gap_pp": 0.7, "k": 2.0, "best": "sac"}
    assert results.parse_result("no result") == ("", {})
    _, counted = results.parse_result("RESULT envs=a,b learned=1 of 2 rule=x passed_validation=2 of 2 n=3 of")
    assert counted == {"envs": "a,b", "learned": "1 of 2", "rule": "x", "passed_validation": "2 of 2", "n": 3.0}


def test_a_full_measurement_is_not_replaced_by_a_smoke_run() -> None:
    assert results.keep({"status": "ok", "budget": "full"}, "tiny", redo=True)
    assert results.keep({"status": "ok", "budget": "tiny"}, "tiny", redo=False)
    assert not results.keep({"status": "ok", "budget": "tiny"}, "tiny", redo=True)
    assert not results.keep({"status": "failed (exit 1)", "budget": "full"}, "full", redo=False)


def test_every_documented_benchmark_script_is_registered() -> None:
    registered = {b.script for b in results.BENCHMARKS}
    assert all((BENCHMARKS / s).is_file() for s in registered)
    readme = (BENCHMARKS.parent / "README.md").read_text()
    documented = {line.split()[1].removeprefix("benchmarks/") for line in readme.splitlines()
                  if line.startswith("python benchmarks/")}  # fmt: skip
    assert documented - {"results.py"} <= registered, documented - registered


def test_two_regenerations_side_by_side_keep_each_others_records(tmp_path: Path) -> None:
    """A regeneration writes its own records into results.json as it is on disk when it writes, not the copy it
    read at its start: another one that finished meanwhile keeps its record."""
    path = tmp_path / "results.json"
    started_with = {"machine": {"cpu": "x"}, "runs": {"learning": {"status": "old"}}}
    # meanwhile another invocation (--only memory) finished, and learning was re-measured by a third
    path.write_text(json.dumps({"runs": {"learning": {"status": "new"}, "memory": {"status": "ok"}}}))
    mine = {**started_with, "runs": {"learning": {"status": "old"}, "envs": {"status": "ok", "mine": True}}}
    out = results.merged(path, mine, ["envs"])
    assert out["runs"] == {
        "learning": {"status": "new"},
        "envs": {"status": "ok", "mine": True},
        "memory": {"status": "ok"},
    }  # in the benchmarks' order
    assert list(out["runs"]) == ["learning", "envs", "memory"]
    assert out["machine"] == {"cpu": "x"}
