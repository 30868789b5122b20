"""Test-session set-up shared by every test: the process mode that ``harmonyrl`` commands run in.

``setup_process`` (every CLI command) turns on torch's deterministic algorithms; tests that call trainer
pieces directly must run in that mode too, or they test something the product never runs. It matters:
the backward of an indexed gather (``bias[expert_ids]`` in transformers' grouped MoE experts) accumulates
in a thread-timing-dependent order otherwise, measured at 1 in 3000 backward passes differing in the last
bit on an idle 2-core machine and 129 in 3000 with both cores busy.
"""

import harmonyrl  # noqa: F401  # first: it sets MKL's reproducibility mode before torch's first matrix product

# isort: split
import torch

torch.use_deterministic_algorithms(True, warn_only=True)


# ---- skips are loud, and in CI only an optional extra may be missing ------------------------------------------
# A skipped check is a check that did not run. Every skip is listed in a banner at the end of the run; under
# CI (CI=true, as .ci/run runs) a skip fails the run unless its reason names an optional extra that CI does not
# install on purpose — so a missing bubblewrap, chromium or package is a red run, not a quiet "s".
import os  # noqa: E402

import pytest  # noqa: E402

ALLOWED_IN_CI = ("wandb is not installed",)
"""Skip reasons CI accepts: optional extras it deliberately leaves out (wandb is a large, account-bound package)."""

_skipped: list[tuple[str, str]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped:
        reason = str(report.longrepr[2]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _skipped.append((report.nodeid, reason.removeprefix("Skipped: ")))


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _skipped:
        return
    terminalreporter.section("SKIPPED CHECKS — these did not run", sep="!", bold=True, red=True)
    for nodeid, reason in _skipped:
        verdict = "allowed" if any(a in reason for a in ALLOWED_IN_CI) else "NOT ALLOWED IN CI"
        terminalreporter.line(f"{nodeid}: {reason}  [{verdict}]", red=verdict != "allowed")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    bad = [n for n, r in _skipped if not any(a in r for a in ALLOWED_IN_CI)]
    if _in_ci() and bad and exitstatus == 0:
        session.exitstatus = 1
