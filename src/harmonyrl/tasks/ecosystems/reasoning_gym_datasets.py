"""What reasoning-gym offers and how one of its datasets is configured: task names, knobs, curriculum levels.

Imports the package on first use (:mod:`.packages`: a missing one is a one-line error naming the extra); every
mistake in ``env.tasks`` / ``env.config`` / ``env.levels`` is a one-line ``ValueError`` naming the setting, said
when the config is validated, before any compute.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping, Sequence
from typing import Any

from harmonyrl.tasks.ecosystems.packages import require, version_of

DISTRIBUTION = "reasoning-gym"
Knob = bool | int | float | str | None | list[bool | int | float | str]
"""A value of ``env.config.<task>.<knob>`` (YAML scalars, or a list of them)."""
SET_BY_HARMONYRL = ("seed", "size")
"""Dataset knobs the adapter sets itself (the run's seed; the number of draws)."""


def _rg() -> Any:
    return require("reasoning_gym", DISTRIBUTION, "reasoning-gym")


def registry() -> tuple[dict[str, Any], dict[str, Any]]:
    """reasoning-gym's (datasets, curricula) registries: name → (dataset class, config class); name → curriculum."""
    _rg()
    from reasoning_gym.factory import CURRICULA, DATASETS

    return DATASETS, CURRICULA


def _close(name: str, known: Sequence[str]) -> str:
    near = difflib.get_close_matches(name, known, n=3)
    return f" (did you mean {', '.join(near)}?)" if near else ""


def check_task_names(tasks: Sequence[str]) -> None:
    """Each name is a reasoning-gym dataset (not ``composite``), else a one-line ``ValueError``."""
    datasets, _ = registry()
    for name in tasks:
        if name == "composite":
            raise ValueError("env.tasks: 'composite' is reasoning-gym's own mixer; list its tasks in env.tasks instead")
        if name not in datasets:
            near = _close(name, sorted(datasets))
            raise ValueError(f"env.tasks: '{name}' is not a reasoning-gym {version_of(DISTRIBUTION)} task{near}")


def max_level(task: str) -> int:
    """The highest difficulty level of ``task``'s reasoning-gym curriculum (0 without one)."""
    _, curricula = registry()
    if task not in curricula:
        return 0
    return max(len(a.levels) for a in curricula[task]().attributes.values()) - 1


def _curriculum_fields(task: str) -> set[str]:
    _, curricula = registry()
    if task not in curricula:
        return set()
    fields: set[str] = set()
    for a in curricula[task]().attributes.values():
        fields.update(getattr(a, n) for n in ("field_name", "lower_field_name", "upper_field_name") if hasattr(a, n))
    return fields


def dataset_config(task: str, knobs: Mapping[str, Knob], seed: int, size: int, level: int | None) -> Any:
    """The task's reasoning-gym config dataclass with ``knobs`` (at curriculum ``level`` when given), validated by
    the dataset's own ``validate``; a bad knob is a one-line ``ValueError`` naming ``env.config.<task>.<knob>``."""
    datasets, curricula = registry()
    _, config_cls = datasets[task]
    fields = {f.name for f in dataclasses.fields(config_cls)}
    for knob in knobs:
        if knob in SET_BY_HARMONYRL:
            raise ValueError(f"env.config.{task}.{knob} is set by harmonyrl (the run's seed, the split sizes)")
        if knob not in fields:
            known = sorted(fields - set(SET_BY_HARMONYRL))
            raise ValueError(f"env.config.{task}.{knob}: {task} has no knob '{knob}' (it has: {', '.join(known)})")
    args: dict[str, Any] = {**knobs, "seed": seed, "size": size}
    try:
        if level is None:
            config = config_cls(**args)
        else:
            from reasoning_gym.coaching.base_curriculum import DefaultCurriculumContext, RangeAttributeMode

            if task not in curricula:
                raise ValueError(f"env.levels: {task} has no reasoning-gym curriculum (no difficulty levels)")
            taken = sorted(set(knobs) & _curriculum_fields(task))
            if taken:
                raise ValueError(f"env.config.{task}.{taken[0]} is set by env.levels (the task's curriculum)")
            curriculum = curricula[task]()
            for name, attr in curriculum.attributes.items():
                curriculum.set_attr_level(name, min(level, len(attr.levels) - 1))
            context = DefaultCurriculumContext(mode=RangeAttributeMode.UPPER_BOUND)
            config = curriculum.generate_configuration(defaults=args, context=context)
        if hasattr(config, "validate"):
            config.validate()
    except ValueError:
        raise
    except Exception as e:  # reasoning-gym validates with assert: AssertionError, TypeError on a wrong type
        raise ValueError(f"env.config.{task}: reasoning-gym refuses these knobs: {type(e).__name__}: {e}") from None
    return config
