"""Named presets: config files shipped in ``harmonyrl/presets/`` and chosen by name (``-p NAME``, ``--preset NAME``).

A preset is a YAML file with the schema of a ``-c`` file (:mod:`harmonyrl.config`); every ``*.yaml`` / ``*.yml`` file
in the folder is one, named by its file name without the suffix. It is applied before ``-c`` and the dotted overrides,
so anything given on the command line wins. Its first comment line is its one-line description
(``harmonyrl presets`` lists them). Which values each shipped preset holds, and the sweep that chose them:
docs/sweeps.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PRESETS_DIR = Path(__file__).parent / "presets"
SUFFIXES = (".yaml", ".yml")


class PresetError(ValueError):
    """An unknown preset name: one line naming the known ones."""


@dataclass(frozen=True)
class Preset:
    """One preset file: its name (the file name without the suffix), path and one-line description."""

    name: str
    path: Path
    description: str


def description(path: Path) -> str:
    """The file's first comment line without its ``#`` (empty when the file has none before its first key)."""
    for line in path.read_text(encoding="utf-8").splitlines():
        text = line.strip()
        if text.startswith("#"):
            return text.lstrip("#").strip()
        if text:
            return ""
    return ""


def available(folder: Path | None = None) -> list[Preset]:
    """Every preset in ``folder`` (default: the shipped ones, :data:`PRESETS_DIR`), sorted by name."""
    folder = PRESETS_DIR if folder is None else folder
    if not folder.is_dir():
        return []
    files = sorted(p for p in folder.iterdir() if p.suffix in SUFFIXES and p.is_file())
    return [Preset(p.stem, p, description(p)) for p in files]


def find(name: str, folder: Path | None = None) -> Path:
    """The file of preset ``name`` (:class:`PresetError` naming the known ones when there is none)."""
    presets = available(folder)
    for preset in presets:
        if preset.name == name:
            return preset.path
    known = ", ".join(p.name for p in presets) or "none"
    raise PresetError(f"unknown preset '{name}' (known: {known}; `harmonyrl presets` describes them)")
