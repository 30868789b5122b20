"""The user's own code, named in a config or on the command line as ``MODULE:NAME`` or ``FILE.py:NAME``.

``harmonyrl check-env``, ``env.factory`` and ``sft.expert`` all take such a target. Imports resolve as with
``python -m MODULE`` (the working directory first) and ``python FILE.py`` (the file's folder first), so no
``PYTHONPATH`` is needed. A run records a file target with an absolute path (:func:`resolve_target`), so that
``--resume`` or ``eval`` started from another folder loads the same file.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import cast

from harmonyrl.envs.base import EnvFactory
from harmonyrl.errors import UserError


class TargetError(ValueError):
    """A target that does not name a callable: malformed, missing file or module, missing or non-callable name.
    The message is one line and does not repeat the target (the caller says which setting it came from)."""


class UserCodeError(UserError, ValueError):
    """The user's code named in the config (``env.factory``, ``sft.expert``) does not load, does not accept the
    arguments it is given, fails while it runs, or breaks the environment contract: one line naming the setting."""


def _split(target: str) -> tuple[str, str]:
    module_part, sep, attr = target.rpartition(":")
    if not sep or not module_part or not attr:
        raise TargetError(f"expected MODULE:NAME or FILE.py:NAME, got {target!r}")
    return module_part, attr


def resolve_target(target: str) -> str:
    """``target`` as a run records it: a file made absolute (relative to the working directory), a module
    unchanged. Raises :class:`TargetError` when it is malformed or names a file that does not exist."""
    module_part, attr = _split(target)
    if not module_part.endswith(".py"):
        return target
    path = Path(module_part).expanduser()
    if not path.is_file():
        raise TargetError(f"no such file: '{path}'")
    return f"{path.resolve()}:{attr}"


def _import(module_part: str) -> ModuleType:
    if module_part.endswith(".py"):
        path = Path(module_part).expanduser()
        if not path.is_file():
            raise TargetError(f"no such file: '{path}'")
        _first_on_path(str(path.resolve().parent))
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None:
            raise TargetError(f"cannot load '{path}' as a Python module")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    _first_on_path(os.getcwd())
    try:
        return importlib.import_module(module_part)
    except ModuleNotFoundError as e:  # the bare "No module named 'x'" does not say who asked
        parents = {".".join(module_part.split(".")[: i + 1]) for i in range(module_part.count(".") + 1)}
        if e.name in parents:
            raise TargetError(f"module '{e.name}' not found (looked in the working directory and sys.path)") from e
        raise TargetError(f"importing '{module_part}' failed: {e}{where_in_user_code(e)}") from e


def load_callable(target: str) -> Callable[..., object]:
    """``"pkg.module:name"`` or ``"path/to/file.py:name"`` → the callable it names.

    Raises :class:`TargetError` (one line) for a malformed target, a missing file or module, or a missing or
    non-callable name. An exception raised by the user's module while it is imported propagates unchanged.
    """
    module_part, attr = _split(target)
    module = _import(module_part)
    found = getattr(module, attr, None)
    if found is None:
        raise TargetError(f"'{module_part}' has no '{attr}'")
    if not callable(found):
        raise TargetError(f"'{module_part}:{attr}' is a {type(found).__name__}, not a callable")
    return cast(Callable[..., object], found)


def load_factory(target: str) -> Callable[..., EnvFactory]:
    """The factory callable ``target`` names (what it builds is :func:`harmonyrl.envs.checker.check_env`'s
    business). Raises :class:`TargetError` as :func:`load_callable`."""
    return cast(Callable[..., EnvFactory], load_callable(target))  # what it returns: check_env checks


def where_in_user_code(error: BaseException) -> str:
    """`` (file:line)`` of the innermost frame outside this package, the standard library and installed
    packages: where the user's code failed ('' if none)."""
    import sysconfig

    paths = sysconfig.get_paths()
    skip = {Path(__file__).resolve().parents[1], *(Path(paths[k]).resolve() for k in ("stdlib", "purelib", "platlib"))}
    frames = [
        f
        for f in traceback.extract_tb(error.__traceback__)
        if Path(f.filename).is_file() and not skip & set(Path(f.filename).resolve().parents)
    ]
    return f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""


def _first_on_path(folder: str) -> None:
    if folder not in sys.path and not (folder == os.getcwd() and "" in sys.path):
        sys.path.insert(0, folder)
