"""The HTML run report: files written, escaping, graceful gaps, clear errors, and how it renders in Chromium."""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from synthetic_run import ALL_TITLES, XSS, write_synthetic_run

from harmonyrl.telemetry.report import ReportError, write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class _Dom(HTMLParser):
    """Headings, images and the visible text of a page, as Chromium serialised it."""

    def __init__(self) -> None:
        super().__init__()
        self.h2: list[str] = []
        self.img_src: list[str] = []
        self.scripts = 0
        self.text: list[str] = []
        self._in_h2 = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._in_h2 = tag == "h2"
        self.scripts += tag == "script"
        if tag == "img":
            self.img_src.append(dict(attrs).get("src") or "")

    def handle_endtag(self, tag: str) -> None:
        self._in_h2 = self._in_h2 and tag != "h2"

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._in_h2:
            self.h2.append(data)


def _pixels(png: bytes | Path) -> np.ndarray:
    img = Image.open(png if isinstance(png, Path) else io.BytesIO(png))
    return np.asarray(img.convert("RGB"))


def _is_blank(pixels: np.ndarray) -> bool:
    return bool((pixels == pixels[0, 0]).all())


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_report(write_synthetic_run(tmp_path_factory.mktemp("r") / "run"))


def _embedded(page: str) -> dict[str, bytes]:
    """The page's plots: section id → the PNG embedded in it."""
    found = re.findall(r'<section id="([\w-]+)">.*?<img alt="[^"]*" src="data:image/png;base64,([^"]+)"', page)
    return {slug: base64.b64decode(data, validate=True) for slug, data in found}


def test_embeds_one_png_per_plot_and_writes_nothing_else(report: Path) -> None:
    assert report.name == "index.html" and report.parent.name == "report"
    assert [p.name for p in report.parent.iterdir()] == ["index.html"]  # self-contained: one file
    page = report.read_text()
    plots = _embedded(page)
    assert len(plots) == len(ALL_TITLES) == page.count("<img ")
    for slug, data in plots.items():
        assert data.startswith(PNG_MAGIC) and len(data) > 8_000, slug
        pixels = _pixels(data)
        assert pixels.shape[1] >= 700 and not _is_blank(pixels), slug
    assert 'src="http' not in page and "<link" not in page  # nothing to fetch


def test_escapes_everything_from_the_run(report: Path) -> None:
    page = report.read_text()
    assert "<script" not in page.lower()
    assert "&lt;script&gt;alert(&#x27;pwned&#x27;)&lt;/script&gt;" in page
    assert "synthetic &lt;b&gt;run&lt;/b&gt;" in page and "<b>run</b>" not in page


def test_header_summary_config_and_episodes(report: Path) -> None:
    page = report.read_text()
    assert "<details><summary>Resolved config (config.yaml)</summary>" in page
    for fact in ("success_after", "0.6", "RL steps", "SFT steps"):
        assert fact in page
    assert page.count('<article class="episode">') == 4
    assert "failed: tool_timeout" in page and "functions.calculator" in page
    assert "parse error: expected &lt;|message|&gt; after &lt;|channel|&gt;" in page
    # each sample episode shows what was asked and the answer that would have scored, beside reward and terms
    assert page.count('<span class="tag">prompt</span><pre>What is 2 + 2?</pre>') == 4
    assert page.count('<span class="tag">expected answer</span><pre>4</pre>') == 4
    assert "reward 1 · correct=1" in page


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install -y chromium); CI installs it")
def test_renders_in_headless_chromium(report: Path, tmp_path: Path) -> None:
    shot = tmp_path / "shot.png"
    cmd = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--window-size=1200,2400",
        f"--screenshot={shot}",
        "--dump-dom",
        report.as_uri(),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    dom = _Dom()
    dom.feed(done.stdout)

    assert dom.h2 == [*ALL_TITLES, "Sample episodes"]
    assert len(dom.img_src) == len(ALL_TITLES)
    for src in dom.img_src:
        prefix = "data:image/png;base64,"
        assert src.startswith(prefix)
        decoded = base64.b64decode(src.removeprefix(prefix), validate=True)
        assert decoded.startswith(PNG_MAGIC) and not _is_blank(_pixels(decoded))
    assert dom.scripts == 0
    assert XSS in "".join(dom.text)  # shown as text, not run

    pixels = _pixels(shot)
    assert pixels.shape[:2] == (2400, 1200) and not _is_blank(pixels)
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 50
    # matplotlib's first colour (#1f77b4) on screen proves the plots were painted, not just the text
    blue = np.abs(pixels.astype(int) - [31, 119, 180]).sum(axis=-1) < 30
    assert blue.sum() > 2_000


def _small_run(run: Path, *extra: dict[str, object]) -> Path:
    """Like a quick-config run: SFT, rollouts that never updated the policy (no train/ keys), no rollouts dir."""
    run.mkdir()
    rows = [{"step": s, "phase": "sft", "sft/loss": 3.0 - 0.1 * s} for s in range(5)]
    rows += [{"step": 1, "phase": "rl", "rollout/reward": 0.0, "rollout/failed": 0.0, "time/rollout_s": 0.2}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [*rows, *extra]))
    return run


def test_short_run_skips_missing_metrics_gracefully(tmp_path: Path) -> None:
    run = _small_run(tmp_path / "quick")
    page = write_report(run).read_text()
    assert set(_embedded(page)) == {"reward", "sft", "time"}
    assert "No environment failures in 1 recorded RL steps." in page
    assert "Not recorded in this run: KL divergence" in page
    assert "No episodes recorded" in page
    assert "Run report: quick" in page  # no config.yaml: the folder name


def test_rerun_drops_plots_that_no_longer_apply_and_old_png_files(tmp_path: Path) -> None:
    run = _small_run(tmp_path / "run", {"step": 2, "phase": "rl", "train/entropy": 1.0})
    assert "entropy" in _embedded(write_report(run).read_text())
    (run / "report" / "entropy.png").write_bytes(PNG_MAGIC)  # as an earlier version wrote them
    (run / "metrics.jsonl").write_text('{"step": 0, "phase": "sft", "sft/loss": 1.0}\n')
    assert list(_embedded(write_report(run).read_text())) == ["sft"]
    assert [p.name for p in (run / "report").iterdir()] == ["index.html"]


def test_cut_off_last_line_is_reported_not_fatal(tmp_path: Path) -> None:
    run = _small_run(tmp_path / "run")
    with (run / "metrics.jsonl").open("a") as fh:
        fh.write('{"step": 7, "phase": "rl", "rollout/rew')
    assert "ignored a cut-off last line" in write_report(run).read_text()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no metrics.jsonl here"),
        ("", "no metrics recorded yet"),
        ('{"step": 0, "phase": "sft"}\n{not json}\n{"step": 1}\n', r"metrics\.jsonl:2: corrupt line, not valid JSON"),
        ('{"step": 0}\n[1, 2]\n', r"metrics\.jsonl:2: corrupt line, expected a JSON object"),
        ('{"step": "3"}\n', r"metrics\.jsonl:1: corrupt line"),
    ],
)
def test_bad_metrics_are_one_line_errors(tmp_path: Path, content: str | None, message: str) -> None:
    if content is not None:
        (tmp_path / "metrics.jsonl").write_text(content)
    with pytest.raises(ReportError, match=message) as err:
        write_report(tmp_path)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "report").exists()  # nothing written for a run that cannot be reported


def test_missing_run_folder_and_corrupt_rollouts(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match="no such run folder"):
        write_report(tmp_path / "nope")
    run = _small_run(tmp_path / "run")
    (run / "rollouts").mkdir()
    (run / "rollouts" / "step_1.jsonl").write_text('{"step": 1, "turns": []}\ngarbage\n')
    with pytest.raises(ReportError, match=r"step_1\.jsonl:2: not valid JSON"):
        write_report(run)


def test_a_team_episode_names_the_role_that_played_it() -> None:
    from harmonyrl.telemetry.report import _episode

    line = {"step": 1, "task_id": "relay-1", "reward": 1.0, "failure": None, "turns": []}
    assert "role planner&lt;b&gt;" in _episode(line | {"team_role": "planner<b>"})  # escaped, like every field
    assert "role " not in _episode(line)  # a single agent's episode names no role


def test_the_plan_check_is_a_table_of_its_own(tmp_path: Path) -> None:
    run = write_synthetic_run(tmp_path / "run")
    summary = json.loads((run / "summary.json").read_text())
    summary["plan"] = {"hardware": "this machine (measured)", "predicted": {"step_s": 5.64, "memory_gib": 1.0},
                       "measured": {"step_s": 5.7, "memory_gib": None},
                       "predicted_over_measured": {"step_s": 0.99, "memory_gib": None}}  # fmt: skip
    (run / "summary.json").write_text(json.dumps(summary))
    page = write_report(run).read_text()
    assert "<h3>Plan check (this machine (measured); docs/plan.md)</h3>" in page
    assert '<tr><td>step_s</td><td class="num">5.64</td><td class="num">5.7</td><td class="num">0.99</td></tr>' in page
    assert "{&quot;hardware" not in page  # not dumped as JSON into the summary table
