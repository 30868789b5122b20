"""Named presets: config files shipped in ``harmonyrl/presets/`` and chosen by name (``-p NAME``, ``--preset NAME``).

A preset is a YAML file with the schema of a ``-c`` file (:mod:`harmonyrl.config`); every ``*.yaml`` / ``*.yml`` file
in the folder is one, named by its file name without the suffix. It is applied before ``-c`` and the dotted overrides,
so anything given on the command line wins. Its leading comment's first sentence is its description
(``harmonyrl presets`` lists them whole). Which values each shipped preset holds, and the sweep that chose them:
docs/sweeps.md. Algorithm presets (``harmonyrl compare --algos``) live in the ``algorithms/`` subfolder, one per
named algorithm, each an ``rl`` section of the same schema (:class:`harmonyrl.algorithms.choices.NamedAlgorithm`).
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
    """The first sentence of the file's leading comment, whole, though it may run over several comment lines
    (empty when the file has no comment before its first key). It ends at a sentence's full stop, or at the end of
    a line whose next comment line starts a new sentence (a capital letter, a parenthesis)."""
    lines: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        text = line.strip()
        if not text.startswith("#"):
            if text or lines:
                break
            continue
        text = text.lstrip("#").strip()
        if lines and (not text or text[0].isupper() or text[0] == "("):
            break
        lines.append(text)
        if text.endswith("."):
            break
    joined = " ".join(lines)
    end = joined.find(". ")
    return joined[: end + 1] if end >= 0 else joined


def algorithms_folder() -> Path:
    """The folder of the algorithm presets (``harmonyrl compare --algos NAME``), inside :data:`PRESETS_DIR`."""
    return PRESETS_DIR / "algorithms"


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
