"""An ecosystem's package, imported on first use: a missing or wrongly versioned one is a one-line error naming
the extra that installs it."""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.metadata
import importlib.util
from collections.abc import Mapping
from pathlib import Path
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


def module_version(module: str) -> str:
    """What a run records of an environment's own code, the importable ``module`` (``vf_calc``,
    ``guess_env.client``), without importing it: ``<distribution> <version>`` when its top-level package was
    installed from one; ``source sha256:<12 hex>`` of its ``.py`` files when it is imported from a folder on
    ``sys.path`` (an example run with ``PYTHONPATH``; an edit changes it), or when ``module`` is a ``.py`` file's
    path; ``not importable`` when it is none of these."""
    if module.endswith(".py") or "/" in module:
        file = Path(module)
        return _source_digest([(file.name, file)]) if file.is_file() else "not importable"
    top = module.split(".", 1)[0]
    for dist in _distributions().get(top, []):
        return f"{dist} {version_of(dist)}"
    importlib.invalidate_caches()  # a folder's listing is cached: a module written since would not be found
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        spec = None
    if spec is None or (spec.origin is None and not spec.submodule_search_locations):
        return "not importable"
    if spec.submodule_search_locations:
        files = sorted((str(f.relative_to(root)), f) for root in map(Path, spec.submodule_search_locations)
                       for f in root.rglob("*.py"))  # fmt: skip
    else:
        files = [(Path(str(spec.origin)).name, Path(str(spec.origin)))]
    return _source_digest(files)


def _source_digest(files: list[tuple[str, Path]]) -> str:
    """``source sha256:<12 hex>`` of ``(name, path)`` source files (names and contents, the first
    :data:`MAX_SOURCE_FILES`)."""
    digest = hashlib.sha256()
    for name, f in files[:MAX_SOURCE_FILES]:
        digest.update(name.encode() + b"\0" + f.read_bytes() + b"\0")
    return f"source sha256:{digest.hexdigest()[:12]}"


@functools.cache
def _distributions() -> Mapping[str, list[str]]:
    """Top-level module → the distributions that install it (read once: it scans every installed package)."""
    return importlib.metadata.packages_distributions()


MAX_SOURCE_FILES = 2000
"""A local package's ``.py`` files hashed for :func:`module_version` (the first, by path)."""


def same_env_version(recorded: str, installed: str, what: str) -> str:
    """``recorded`` (a run's ``env.env_version``) if it is what is importable now; else a ``ValueError`` naming both:
    the environment's code changed since the run, so resuming or evaluating under it is another experiment."""
    if recorded != installed:
        raise ValueError(f"env.env_version: this run was made with {what} at {recorded}, but it is {installed} now "
                         "(restore that version, or start a new run)")  # fmt: skip
    return recorded
