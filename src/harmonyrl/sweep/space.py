"""The search space of a sweep: which config fields vary, and over what.

Given on the command line (``--param rl.lr=log:1e-5:1e-3``) or in a YAML file (``--space space.yaml``) whose keys
are dotted config keys and whose values are the same strings, a mapping (``{kind: log, low: 1e-5, high: 1e-3}``)
or a list (a choice). Every range is checked against the config schema before any trial runs: each end of a range
(and a point inside it, which catches a float range on an integer field) and each choice is loaded as an override
of the sweep's base config, so an unknown key or an out-of-bounds value is the config's own one-line error.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import yaml
from pydantic import Field, TypeAdapter, ValidationError, model_validator

from harmonyrl.config import ConfigError
from harmonyrl.frozen import Frozen

if TYPE_CHECKING:  # optuna is an optional dependency, imported where the distributions are built
    from optuna.distributions import BaseDistribution

Scalar = bool | int | float | str | None
"""A value a config field can take from the command line (and Optuna can store as a choice)."""

RESERVED = ("output_dir", "run_name", "threads")
"""Keys the sweep sets itself for each trial: its folder, its name, its share of the cores."""


class SpaceError(ValueError):
    """A mistake in the search space: the message is one line naming the parameter."""


class FloatParam(Frozen):
    """A float drawn uniformly from [low, high] (on a grid of ``step`` when given)."""

    kind: Literal["float"] = "float"
    low: float
    high: float
    step: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> FloatParam:
        if not self.low < self.high:
            raise ValueError(f"float needs LOW < HIGH (got {self.low:g}, {self.high:g})")
        return self


class LogParam(Frozen):
    """A float drawn log-uniformly from [low, high] (learning rates, coefficients)."""

    kind: Literal["log"] = "log"
    low: float = Field(gt=0)
    high: float

    @model_validator(mode="after")
    def _ordered(self) -> LogParam:
        if not self.low < self.high:
            raise ValueError(f"log needs 0 < LOW < HIGH (got {self.low:g}, {self.high:g})")
        return self


class IntParam(Frozen):
    """An integer drawn uniformly from {low, low + step, …, high}."""

    kind: Literal["int"] = "int"
    low: int
    high: int
    step: int = Field(1, ge=1)

    @model_validator(mode="after")
    def _ordered(self) -> IntParam:
        if not self.low < self.high:
            raise ValueError(f"int needs LOW < HIGH (got {self.low}, {self.high})")
        return self


class ChoiceParam(Frozen):
    """One of a list of values (numbers, strings, booleans, null)."""

    kind: Literal["choice"] = "choice"
    values: tuple[Scalar, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _distinct(self) -> ChoiceParam:
        if len(set(map(repr, self.values))) != len(self.values):
            raise ValueError(f"choice lists a value twice: {list(self.values)}")
        return self


Param = Annotated[FloatParam | LogParam | IntParam | ChoiceParam, Field(discriminator="kind")]
_PARAM: TypeAdapter[FloatParam | LogParam | IntParam | ChoiceParam] = TypeAdapter(Param)

SYNTAX = "float:LOW:HIGH[:STEP], log:LOW:HIGH, int:LOW:HIGH[:STEP] or choice:A,B,..."


def parse_param(text: str) -> tuple[str, Param]:
    """``rl.lr=log:1e-5:1e-3`` → ("rl.lr", LogParam(low=1e-5, high=1e-3)); a mistake is a :class:`SpaceError`."""
    key, sep, spec = text.partition("=")
    if not sep or not key.strip():
        raise SpaceError(f"--param '{text}' is not KEY=SPEC (SPEC: {SYNTAX})")
    try:
        return key.strip(), parse_spec(spec)
    except SpaceError as e:
        raise SpaceError(f"--param '{text}': {e}") from None


def parse_spec(spec: str) -> Param:
    """``log:1e-5:1e-3``, ``int:8:32:8``, ``choice:8,16`` → the parameter it describes."""
    kind, sep, rest = spec.strip().partition(":")
    if not sep or kind not in ("float", "log", "int", "choice"):
        raise SpaceError(f"expected {SYNTAX}")
    if kind == "choice":
        values = [_yaml_scalar(v) for v in rest.split(",")]
        return _validate({"kind": kind, "values": values})
    parts = rest.split(":")
    names = ("low", "high") if kind == "log" else ("low", "high", "step")
    if not 2 <= len(parts) <= len(names):
        raise SpaceError(f"expected {SYNTAX}")
    number: Callable[[str], float | int] = int if kind == "int" else float
    try:
        fields = {name: number(part) for name, part in zip(names, parts, strict=False)}
    except ValueError:
        raise SpaceError(f"'{rest}' are not {'integers' if kind == 'int' else 'numbers'}") from None
    return _validate({"kind": kind, **fields})


def _yaml_scalar(text: str) -> Scalar:
    """A choice's value as an override reads it (``8`` → 8, ``true`` → True, ``grpo`` → "grpo")."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text.strip()
    if value is not None and not isinstance(value, bool | int | float | str):
        raise SpaceError(f"choice value '{text.strip()}' is not a single value")
    return value


def _validate(raw: object) -> Param:
    try:
        return _PARAM.validate_python(raw)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"][1:])  # without the union's tag
        msg = str(err["msg"]).removeprefix("Value error, ")
        raise SpaceError(f"{where}: {msg}" if where else msg) from None


def load_space_file(path: Path) -> dict[str, Param]:
    """A YAML search space: ``{dotted.key: "log:1e-5:1e-3" | {kind: …, …} | [choice, …]}``."""
    try:
        tree = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise SpaceError(f"cannot read search space '{path}': {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise SpaceError(f"search space '{path}' is not valid YAML: {e}".splitlines()[0]) from None
    if not isinstance(tree, dict) or not tree:
        raise SpaceError(f"search space '{path}' must be a mapping of config keys to ranges")
    space: dict[str, Param] = {}
    for key, spec in tree.items():
        try:
            if isinstance(spec, str):
                space[str(key)] = parse_spec(spec)
            elif isinstance(spec, list):
                space[str(key)] = _validate({"kind": "choice", "values": spec})
            else:
                space[str(key)] = _validate(spec)
        except SpaceError as e:
            raise SpaceError(f"search space '{path}', key '{key}': {e}") from None
    return space


def build_space(file: Path | None, params: Sequence[str]) -> dict[str, Param]:
    """The space of a new sweep: the file's parameters, then ``--param`` ones (which replace a file's key)."""
    space = load_space_file(file) if file is not None else {}
    given: set[str] = set()
    for text in params:
        key, param = parse_param(text)
        if key in given:
            raise SpaceError(f"--param '{key}' is given twice")
        given.add(key)
        space[key] = param
    if not space:
        raise SpaceError("nothing to search: give --param KEY=SPEC (e.g. --param rl.lr=log:1e-5:1e-3) or --space FILE")
    return space


def override(key: str, value: Scalar) -> str:
    """A sampled value as the ``key=value`` override that reads back as the same value (floats keep a decimal
    point, which YAML 1.1 needs to read ``1e-05`` as a number)."""
    if isinstance(value, float) and math.isfinite(value):
        text = repr(value)
        if "e" in text and "." not in text:
            mantissa, _, exponent = text.partition("e")
            text = f"{mantissa}.0e{exponent}"
        return f"{key}={text}"
    if value is None or isinstance(value, bool):
        return f"{key}={'null' if value is None else str(value).lower()}"
    return f"{key}={value}"


def probes(param: Param) -> list[Scalar]:
    """Values that stand for the whole range when checking it against the schema: its ends, and for a float range
    a point inside that no integer field accepts (``float:1:3`` on an integer field fails there, not mid-sweep)."""
    if isinstance(param, ChoiceParam):
        return list(param.values)
    if isinstance(param, IntParam):
        return [param.low, param.high]
    inside = (
        math.exp(math.log(param.low) + 0.37 * math.log(param.high / param.low))
        if isinstance(param, LogParam)
        else param.low + 0.37 * (param.high - param.low)
    )
    if isinstance(param, FloatParam) and param.step is not None:  # a grid point, as Optuna would draw
        inside = param.low + math.floor(0.37 * (param.high - param.low) / param.step) * param.step
    return [param.low, param.high, inside]


def check_space(space: Mapping[str, Param], fixed: Sequence[str], load: Callable[[list[str]], object]) -> None:
    """Refuse, before any compute, a key the sweep sets itself, a key both fixed and searched, and any value of
    the space the config refuses (``load`` builds the base config with extra overrides; it raises ConfigError)."""
    fixed_keys = {o.partition("=")[0].strip() for o in fixed}
    for key, param in space.items():
        if key in RESERVED:
            raise SpaceError(f"'{key}' cannot be searched: the sweep sets it for each trial")
        if key in fixed_keys:
            raise SpaceError(f"'{key}' is both a fixed override and a searched parameter")
        for value in probes(param):
            try:
                load([*fixed, override(key, value)])
            except ConfigError as e:
                raise SpaceError(f"search space '{key}' at {value!r}: {e}") from None


def distributions(space: Mapping[str, Param]) -> dict[str, BaseDistribution]:
    """The space as Optuna distributions, one per dotted key."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    out: dict[str, BaseDistribution] = {}
    for key, p in space.items():
        if isinstance(p, ChoiceParam):
            out[key] = CategoricalDistribution(p.values)
        elif isinstance(p, IntParam):
            out[key] = IntDistribution(p.low, p.high, step=p.step)
        elif isinstance(p, LogParam):
            out[key] = FloatDistribution(p.low, p.high, log=True)
        else:
            out[key] = FloatDistribution(p.low, p.high, step=p.step)
    return out


def describe(key: str, param: Param) -> str:
    """One parameter as the user would write it (``rl.lr=log:1e-05:0.001``)."""
    if isinstance(param, ChoiceParam):
        return f"{key}=choice:{','.join(str(v) for v in param.values)}"
    step = "" if isinstance(param, LogParam) or param.step in (None, 1) else f":{param.step:g}"
    return f"{key}={param.kind}:{param.low:g}:{param.high:g}{step}"
