"""``harmonyrl report RUN_DIR``: one self-contained HTML page that tells a run's story.

The page is a single file, ``RUN_DIR/report/index.html``, with the plots embedded as base64 data URIs, so it
can be mailed, attached to an issue or opened from a copied folder with nothing else; no other file is
written (a plot can be saved from the browser). It holds no script and loads nothing from the network. Every
string that came from the run (config, episode text, tool output, task ids) is HTML-escaped: model output is
untrusted text.

It reads only the run folder: ``metrics.jsonl`` (required), ``config.yaml``, ``summary.json`` and
``rollouts/*.jsonl`` (optional). User mistakes — not a run folder, a corrupt metrics file — are a
:class:`ReportError` with a one-line message for the CLI to print. A cut-off last line (a run killed
mid-write) is tolerated and mentioned, because the report is most wanted for runs that died.

matplotlib is imported only inside :func:`write_report`, so importing :class:`ReportError` stays cheap.
"""

from __future__ import annotations

import base64
import html
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from harmonyrl.telemetry.episodes import Episode, iter_episodes, select_episodes
from harmonyrl.telemetry.mismatch_note import mismatch_note
from harmonyrl.telemetry.series import Series, as_float, collect_series

if TYPE_CHECKING:
    from harmonyrl.telemetry.report_plots import Plot


class ReportError(ValueError):
    """The run folder cannot be reported on (missing, or its metrics file is corrupt); the message is one line."""


@dataclass
class RunData:
    name: str
    rows: list[dict[str, object]]
    config_text: str | None = None
    summary: dict[str, object] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def load_metrics(path: Path) -> tuple[list[dict[str, object]], list[str]]:
    """Rows of ``metrics.jsonl`` and warnings. Raises :class:`ReportError` if missing, unreadable or corrupt."""
    if not path.is_file():
        raise ReportError(f"{path.parent}: no metrics.jsonl here — is this a run folder?")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ReportError(f"{path}: cannot read ({e})") from None
    lines = text.splitlines()
    rows: list[dict[str, object]] = []
    warnings: list[str] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if number == len(lines) and not text.endswith("\n"):
                warnings.append(f"{path.name}:{number}: ignored a cut-off last line (the run was interrupted)")
                break
            raise ReportError(f"{path}:{number}: corrupt line, not valid JSON ({e.msg})") from None
        step = row.get("step") if isinstance(row, dict) else None
        if not isinstance(step, int) or isinstance(step, bool):
            raise ReportError(f'{path}:{number}: corrupt line, expected a JSON object with an integer "step"')
        rows.append(row)
    if not rows:
        raise ReportError(f"{path}: no metrics recorded yet")
    return rows, warnings


def load_run(run_dir: Path) -> RunData:
    if not run_dir.is_dir():
        raise ReportError(f"{run_dir}: no such run folder")
    rows, warnings = load_metrics(run_dir / "metrics.jsonl")
    data = RunData(name=run_dir.name, rows=rows, warnings=warnings)
    config_path = run_dir / "config.yaml"
    if config_path.is_file():
        data.config_text = config_path.read_text(encoding="utf-8", errors="replace")
        try:
            config = yaml.safe_load(data.config_text)
        except yaml.YAMLError:
            config = None
            data.warnings.append("config.yaml is not valid YAML; shown as text")
        if isinstance(config, dict) and isinstance(config.get("run_name"), str):
            data.name = config["run_name"]
    summary_path = run_dir / "summary.json"
    if summary_path.is_file():
        try:
            summary = json.loads(summary_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            summary = None
        if isinstance(summary, dict):
            data.summary = summary
        else:
            data.warnings.append("summary.json is not a JSON object; left out")
    return data


def _episodes(run_dir: Path, limit: int) -> list[Episode]:
    def stream() -> Iterator[Episode]:
        for path in sorted((run_dir / "rollouts").glob("*.jsonl")):
            yield from iter_episodes(path)

    try:
        return select_episodes(stream(), limit)
    except (ValueError, UnicodeDecodeError) as e:
        raise ReportError(str(e).splitlines()[0]) from None


# ---------------------------------------------------------------- HTML

CSS = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 1060px;
       padding: 1.5em; color: #1b1f24; background: #fff; }
h1 { margin-bottom: .2em; } h2 { border-bottom: 1px solid #d0d7de; padding-bottom: .2em; margin-top: 1.6em; }
.meta, .caption, .note { color: #57606a; } .warn { color: #9a6700; }
table.summary { border-collapse: collapse; margin: .8em 0; }
table.summary td { border: 1px solid #d0d7de; padding: .25em .7em; } table.summary td.num { text-align: right; }
pre { white-space: pre-wrap; word-break: break-word; margin: .2em 0; font-size: 13px; }
details > pre { background: #f6f8fa; padding: .8em; border-radius: 6px; }
img { max-width: 100%; height: auto; display: block; }
nav a { margin-right: .9em; white-space: nowrap; }
.episode { border: 1px solid #d0d7de; border-radius: 8px; padding: .4em 1em .8em; margin: 1em 0; }
.episode h3 { font-size: 15px; } .turn { border-left: 3px solid #d0d7de; padding-left: .8em; margin: .6em 0; }
.msg { border-radius: 6px; padding: .3em .6em; margin: .3em 0; background: #f6f8fa; }
.msg.analysis { background: #f5f0ff; } .msg.final { background: #dafbe1; }
.msg.call { background: #ddf4ff; } .msg.tool { background: #fff8c5; }
.tag { font-size: 12px; font-weight: 600; color: #57606a; } .bad { color: #cf222e; font-weight: 600; }
.task { background: #fbefff; border-radius: 6px; padding: .3em .6em; margin: .3em 0; }
"""

esc = html.escape


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return value if isinstance(value, str) else json.dumps(value)


def _header(data: RunData, run_dir: Path, series: Series) -> str:
    rl_steps = [step for row in data.rows if row.get("phase") == "rl" and isinstance(step := row["step"], int)]
    facts: dict[str, object] = {
        "SFT steps": len(series["sft/loss"][0]) if "sft/loss" in series else 0,
        "RL steps": max(rl_steps, default=0),
        **{k: v for k, v in data.summary.items() if k != "plan"},
    }
    cells = "".join(f'<tr><td>{esc(str(k))}</td><td class="num">{esc(_fmt(v))}</td></tr>' for k, v in facts.items())
    parts = [
        f"<h1>Run report: {esc(data.name)}</h1>",
        f'<p class="meta">{esc(str(run_dir))} · {len(data.rows)} metric rows</p>',
        f'<table class="summary">{cells}</table>',
        *_plan_check(data.summary.get("plan")),
    ]
    if data.config_text is not None:
        parts.append(
            f"<details><summary>Resolved config (config.yaml)</summary><pre>{esc(data.config_text)}</pre></details>"
        )
    parts += [f'<p class="warn">{esc(w)}</p>' for w in data.warnings]
    return "<header>" + "\n".join(parts) + "</header>"


def _plan_check(plan: object) -> list[str]:
    """The plan's prediction beside the run's measurement (``summary.json``'s ``plan``, docs/plan.md), if any."""
    if not isinstance(plan, dict) or not all(isinstance(plan.get(k), dict) for k in ("predicted", "measured")):
        return []
    predicted, measured, ratio = plan["predicted"], plan["measured"], plan.get("predicted_over_measured") or {}
    head = "<tr><td></td><td>predicted</td><td>measured</td><td>predicted / measured</td></tr>"
    rows = "".join(
        f'<tr><td>{esc(str(k))}</td><td class="num">{esc(_fmt(predicted[k]))}</td>'
        f'<td class="num">{esc(_fmt(measured.get(k)))}</td><td class="num">{esc(_fmt(ratio.get(k)))}</td></tr>'
        for k in predicted
    )
    where = esc(str(plan.get("hardware", "")))
    return [f"<h3>Plan check ({where}; docs/plan.md)</h3>", f'<table class="summary">{head}{rows}</table>']


def _message(msg: object, observation: bool = False) -> str:
    m = msg if isinstance(msg, dict) else {"content": msg}
    role, channel, recipient = (m.get(k) for k in ("role", "channel", "recipient"))
    content = m.get("content")
    text = content if isinstance(content, str) else json.dumps(content)
    kind = "tool" if observation else "call" if recipient not in (None, "assistant") else (channel or "")
    author = m.get("name") or role or "?"
    tag = " · ".join(str(x) for x in (author, channel) if x) + (f" → {recipient}" if recipient else "")
    return f'<div class="msg {esc(str(kind))}"><span class="tag">{esc(tag)}</span><pre>{esc(text)}</pre></div>'


def _term(value: object) -> str:
    number = as_float(value)
    return f"{number:g}" if number is not None else str(value)


def _task(ep: Episode) -> str:
    """What the episode was asked and, where the env has one, the answer that would have scored (for people: the
    model never saw it). Empty for a record written before episodes carried them."""
    rows = [(label, ep.get(key)) for label, key in (("prompt", "prompt"), ("expected answer", "expected_answer"))]
    shown = [
        f'<span class="tag">{label}</span><pre>{esc(text)}</pre>'
        for label, text in rows
        if isinstance(text, str) and text
    ]
    return f'<div class="task">{"".join(shown)}</div>' if shown else ""


def _episode(ep: Episode) -> str:
    reward = as_float(ep.get("reward"))
    head = [f"step {ep['step']}", f"task <code>{esc(str(ep.get('task_id', '?')))}</code>"]
    if ep.get("team_role"):  # a team episode's trajectory: which role played it
        head.append(f"role {esc(str(ep['team_role']))}")
    head.append(f"reward {reward:.3g}" if reward is not None else "reward ?")
    if ep.get("failure"):
        head.append(f'<span class="bad">failed: {esc(str(ep["failure"]))}</span>')
    terms = ep.get("reward_terms")
    if isinstance(terms, dict) and terms:
        head.append(esc(" ".join(f"{k}={_term(v)}" for k, v in terms.items())))
    turns = [_task(ep)]
    for i, turn in enumerate(t for t in ep["turns"] if isinstance(t, dict)):
        body = [_message(m) for m in turn.get("sampled") or []]
        if turn.get("parse_error"):
            body.append(f'<p class="bad">parse error: {esc(str(turn["parse_error"]))}</p>')
        body += [_message(m, observation=True) for m in turn.get("observations") or []]
        turns.append(f'<div class="turn"><span class="tag">turn {i + 1}</span>{"".join(body)}</div>')
    return f'<article class="episode"><h3>{" · ".join(head)}</h3>{"".join(turns)}</article>'


def update_note(series: Series) -> str | None:
    """Why update curves are missing or have gaps: RL steps that applied no update (``train/skipped``: nothing
    trainable, e.g. every group's episodes scored alike) or were rolled back (``guard/skipped``)."""
    steps, flags = series.get("train/skipped", ([], []))
    skipped = [s for s, v in zip(steps, flags, strict=True) if v]
    guarded = sum(v > 0 for v in series.get("guard/skipped", ([], []))[1])
    parts: list[str] = []
    if skipped:
        equal = dict(zip(*series.get("rollout/equal_reward_groups", ([], [])), strict=True))
        groups = dict(zip(*series.get("rollout/groups", ([], [])), strict=True))
        rewards = dict(zip(*series.get("rollout/reward", ([], [])), strict=True))
        all_equal = all(s in equal and equal[s] == groups.get(s) for s in skipped)
        cause = "every group's episodes had equal rewards" if all_equal else "nothing was trainable"
        mean = sum(rewards.get(s, 0.0) for s in skipped) / len(skipped)
        hint = " — the task may be too hard for the warm start" if all_equal and mean == 0.0 else ""
        scope = f"{'any' if len(skipped) == len(steps) else len(skipped)} of the {len(steps)}"
        parts.append(
            f"No update was applied in {scope} RL steps (train/skipped): {cause} (mean rollout reward "
            f"{mean:.2f} on those steps){hint}. The update curves (KL, entropy, gradient norm, clip fraction) "
            "have no points there."
        )
    if guarded:
        parts.append(f"{guarded} RL steps were rolled back by a stability guard (guard/skipped).")
    return " ".join(parts) or None


def render_html(
    run_dir: Path, data: RunData, series: Series, plots: Sequence[Plot], skipped: Sequence[str], eps: Sequence[Episode]
) -> str:
    """The whole page as one string; everything taken from the run folder goes through ``esc``."""
    sections: list[str] = []
    nav: list[str] = []
    for note in (update_note(series), mismatch_note(series)):
        if note is not None:
            sections.append(f'<p class="warn">{esc(note)}</p>')
    for plot in plots:
        uri = "data:image/png;base64," + base64.b64encode(plot.png).decode("ascii")
        nav.append(f'<a href="#{plot.slug}">{esc(plot.title)}</a>')
        sections.append(
            f'<section id="{plot.slug}"><h2>{esc(plot.title)}</h2><p class="caption">{esc(plot.caption)}</p>'
            f'<img alt="{esc(plot.title)}" src="{uri}"></section>'
        )
    if "Failures by class" in skipped and "rollout/failed" in series:
        n = len(series["rollout/failed"][0])
        sections.append(f'<p class="note">No environment failures in {n} recorded RL steps.</p>')
        skipped = [title for title in skipped if title != "Failures by class"]
    if skipped:
        sections.append(f'<p class="note">Not recorded in this run: {esc(", ".join(skipped))}.</p>')
    nav.append('<a href="#episodes">Sample episodes</a>')
    if eps:
        body = "".join(_episode(ep) for ep in eps)
    else:
        body = '<p class="note">No episodes recorded (no rollouts/*.jsonl in the run folder).</p>'
    sections.append(f'<section id="episodes"><h2>Sample episodes</h2>{body}</section>')
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>harmonyrl report: {esc(data.name)}</title><style>{CSS}</style></head><body>\n"
        f"{_header(data, run_dir, series)}\n<nav>{' '.join(nav)}</nav>\n" + "\n".join(sections) + "\n</body></html>\n"
    )


def write_report(run_dir: Path, max_episodes: int = 8) -> Path:
    """Write ``RUN_DIR/report/index.html``, plots embedded, and nothing else; return the HTML path.

    Raises :class:`ReportError` for a missing run folder, a missing/empty/corrupt ``metrics.jsonl`` or a
    corrupt rollouts file. The HTML is written to a temporary file and renamed, so a failure never leaves a
    half-written page over a good one.
    """
    from harmonyrl.telemetry.report_plots import ORDER, build_plots

    run_dir = Path(run_dir)
    data = load_run(run_dir)
    series = collect_series(data.rows)
    eps = _episodes(run_dir, max_episodes)
    plots, skipped = build_plots(series)
    out = run_dir / "report"
    out.mkdir(exist_ok=True)
    for stale in ORDER:  # PNGs an earlier version wrote beside the page: the page no longer refers to them
        (out / f"{stale}.png").unlink(missing_ok=True)
    page = out / "index.html"
    tmp = out / "index.html.tmp"
    tmp.write_text(render_html(run_dir, data, series, plots, skipped, eps), encoding="utf-8")
    os.replace(tmp, page)
    return page
