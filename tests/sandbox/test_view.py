"""Hidden paths are absent from the sandbox's view, by any name; the unsafe fallback refuses to hide anything."""

from __future__ import annotations

import asyncio
import os
import sys
import sysconfig
import this  # noqa: F401  (a standard-library file no start-up reads)
from pathlib import Path

import pytest
from sandbox_helpers import LIMITS, needs_bwrap

from harmonyrl.sandbox import SandboxUnavailable, run_python
from harmonyrl.sandbox.limits import Hidden
from harmonyrl.sandbox.view import stdlib_only

pytestmark = needs_bwrap


def _site() -> str:
    return os.path.realpath(sysconfig.get_path("purelib"))  # this interpreter's own site-packages


def test_a_hidden_directory_is_empty_and_read_only_by_every_route() -> None:
    site = os.path.realpath(_site())
    probe = f"""
import os
for path in ({site!r}, '/proc/self/root' + {site!r}):
    print(len(os.listdir(path)))
try:
    open({site!r} + '/planted.py', 'w')
    print('written')
except OSError as e:
    print(type(e).__name__)
"""
    shown = asyncio.run(run_python(probe, LIMITS))
    assert shown.status == "ok" and int(shown.stdout.split()[0]) > 0  # control: visible without hiding
    hidden = asyncio.run(run_python(probe, LIMITS, hidden=Hidden(dirs=(site,))))
    assert hidden.stdout.split() == ["0", "0", "OSError"]  # EROFS: the cover is mounted read-only


def test_a_hidden_file_cannot_be_read() -> None:
    target = os.path.realpath(sys.modules["this"].__file__ or "")  # a standard-library file the sandbox shows
    probe = f"try:\n    print(len(open({target!r}, 'rb').read()))\nexcept OSError as e:\n    print(type(e).__name__)"
    assert int(asyncio.run(run_python(probe, LIMITS)).stdout) > 0
    assert asyncio.run(run_python(probe, LIMITS, hidden=Hidden(files=(target,)))).stdout == "PermissionError\n"


def test_stdlib_only_hides_every_package_directory_and_named_file() -> None:
    view = stdlib_only(file_names=["THIS.py"])  # names match case-insensitively
    assert _site() in view.dirs
    assert os.path.realpath(sys.modules["this"].__file__ or "") in view.files
    assert not any(f.startswith(d + "/") for f in view.files for d in view.dirs)  # a file under a cover is covered
    probe = "import json, sys\ntry:\n    import pytest\nexcept ImportError:\n    print('stdlib only')\n"
    assert asyncio.run(run_python(probe, LIMITS, hidden=stdlib_only())).stdout == "stdlib only\n"


def test_nothing_can_be_hidden_without_bubblewrap(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-bwrap")
    with pytest.raises(SandboxUnavailable, match=r"cannot hide anything|bubblewrap not found"):
        asyncio.run(run_python("print(1)", LIMITS, allow_unsafe=True, bwrap=missing, hidden=Hidden(dirs=("/usr",))))
