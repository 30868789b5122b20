"""An ecosystem's package, imported on first use: a missing or wrongly versioned one is a one-line error naming
the extra that installs it."""

from __future__ import annotations

import importlib
import importlib.metadata
from types import ModuleType

from harmonyrl.envs.loader import UserCodeError


def require(module: str, distribution: str, extra: str) -> ModuleType:
    """``import module``, or a :class:`UserCodeError` saying ``pip install 'harmonyrl[extra]'``."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise UserCodeError(
            f"env.name={extra.replace('-', '_')} needs the {distribution} package, which does not import here "
            f"({e}): pip install 'harmonyrl[{extra}]'"
        ) from None


def version_of(distribution: str) -> str:
    """The installed version of ``distribution`` ("not installed" when it is not): recorded with a run."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def same_version(recorded: str, module: str, distribution: str, extra: str) -> str:
    """``recorded`` (a run's ``env.package_version``) if ``distribution`` is installed at that version; else the
    one-line error that installs it (:func:`require`) or a ``ValueError`` naming both versions: an environment's
    tasks, rules and scorer are the package's, so a resume or an eval under another version is another experiment."""
    installed = version_of(distribution)
    if installed == "not installed":
        require(module, distribution, extra)
    if recorded != installed:
        raise ValueError(f"env.package_version: this run was made with {distribution} {recorded}, but {installed} is "
                         "installed")  # fmt: skip
    return recorded
