"""``scripts/gpu_check.py``'s time limits: a section stopped at its limit is killed with everything it started and
still reports what it had kept (device time is minutes a session; a slow section must cost its own figures only).
Its sections themselves run in ``.ci/run`` as ``bash scripts/gpu_check.sh --dry-run``."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import gpu_check  # noqa: E402

STUCK_SECTION = """
import json, subprocess, sys, time
from pathlib import Path
out = Path(sys.argv[sys.argv.index("--out") + 1])
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # a benchmark it started
(out / "child.pid").write_text(str(child.pid))
(out / "train.json").write_text(json.dumps({"runs": {"grpo": {"ok": True}}, "status": "partial"}))
time.sleep(600)
"""


def test_a_section_stopped_at_its_limit_is_killed_with_its_children_and_reports_what_it_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stub = tmp_path / "stuck_section.py"
    stub.write_text(STUCK_SECTION)
    monkeypatch.setattr(gpu_check, "__file__", str(stub))  # run_section starts ``python __file__ --section …``
    args = argparse.Namespace(out=tmp_path, dry_run=True, lora_tokens="4096", lora_scoring="trainer")
    with (tmp_path / "gpu_check.log").open("w") as log:
        report = gpu_check.run_section("train", args, 3.0, log)
    assert report == {"runs": {"grpo": {"ok": True}}, "status": "timeout", "seconds": 3.0}
    child = int((tmp_path / "child.pid").read_text())
    for _ in range(50):  # the group got SIGKILL: the child is gone (reaped by init) within moments
        if not _alive(child):
            break
        time.sleep(0.1)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.is_file() and stat.read_text().split()[2] == "Z")  # a zombie is dead


def test_bad_lora_tokens_are_one_line(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--lora-tokens", "4k"])
    with pytest.raises(SystemExit) as exit_:
        gpu_check.main()
    assert exit_.value.code == "gpu_check: --lora-tokens wants comma-separated token counts above 1, got '4k'"
