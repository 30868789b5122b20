"""The ``env`` config of ``env.name=verifiers`` (docs/verifiers.md): which installed verifiers taskset, its
config, and how its tasks are read. Reading it imports no environment; the taskset itself is loaded (and checked)
when the factory is built, before any compute."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator, model_validator

from harmonyrl.envs.loader import UserCodeError
from harmonyrl.frozen import Frozen
from harmonyrl.tasks.ecosystems.packages import module_version, same_env_version, same_version, version_of

if TYPE_CHECKING:
    from harmonyrl.tasks.custom import Expert
    from harmonyrl.tasks.ecosystems.verifiers import VerifiersFactory

DISTRIBUTION = "verifiers"
KwargValue = bool | int | float | str | None | list[bool | int | float | str] | dict[str, Any]
"""A value of ``env.kwargs.<field>``: a YAML scalar, list, or mapping (a nested config such as ``task``)."""
NO_EXPERT = (
    "env.name=verifiers has no scripted expert (a verifiers taskset ships no demonstrations): give "
    "sft.expert=module:fn (examples/verifiers_envs/experts.py has two), sft.demos=FILE, or sft.steps=0"
)


class VerifiersEnvConfig(Frozen):
    """An installed verifiers v1 environment, harmonyrl playing its ``null`` harness (docs/verifiers.md; needs
    ``pip install 'harmonyrl[verifiers]'``)."""

    name: Literal["verifiers"] = "verifiers"
    id: str = Field(min_length=1)
    """The installed taskset module (the package exporting a ``vf.Taskset``), e.g. ``vf_calc``."""
    kwargs: dict[str, KwargValue] = Field(default_factory=dict)
    """The taskset's config (its ``TasksetConfig`` fields): ``env.kwargs.num_tasks=500``."""
    max_tasks: int = Field(100_000, ge=1)
    """Tasks read from the taskset (an infinite one is read this far)."""
    tool_timeout_s: float = Field(10.0, gt=0)
    """Per-call tool timeout; a timeout is an environment fault, masked out of the loss."""
    memory: bool = False
    """Add the ``remember`` / ``recall`` notes tools (:mod:`harmonyrl.envs.memory`) to every episode."""
    package_version: str = Field(default_factory=lambda: version_of(DISTRIBUTION))
    """The verifiers version the run was made with (recorded; another installed version is an error)."""
    env_version: str = ""
    """The taskset module's own version (:func:`~harmonyrl.tasks.ecosystems.packages.module_version`: its
    distribution's, or a hash of its source when it is imported from a folder), recorded with the run; other code
    at a resume or an eval is an error. Empty: filled in from what is importable now."""

    def build_factory(self, seed: int) -> VerifiersFactory:
        """The taskset's tasks (a verifiers taskset draws its own: ``seed`` is its ``env.kwargs.seed`` where it has
        one)."""
        from harmonyrl.tasks.ecosystems.verifiers import VerifiersFactory

        return VerifiersFactory(
            env_id=self.id,
            kwargs=self.kwargs,
            max_tasks=self.max_tasks,
            tool_timeout_s=self.tool_timeout_s,
        )

    def build_expert(self) -> Expert:
        """None: the one-line error that a verifiers env has no scripted expert."""
        raise UserCodeError(NO_EXPERT)

    @field_validator("package_version")
    @classmethod
    def _same_version(cls, recorded: str) -> str:
        return same_version(recorded, "verifiers.v1", DISTRIBUTION, "verifiers")

    @model_validator(mode="before")
    @classmethod
    def _record_env_version(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.get("env_version") and isinstance(data.get("id"), str):
            return {**data, "env_version": module_version(data["id"])}  # the run's config.yaml records it
        return data

    @model_validator(mode="after")
    def _same_env_version(self) -> VerifiersEnvConfig:
        same_env_version(self.env_version, module_version(self.id), f"env.id={self.id}")
        return self
