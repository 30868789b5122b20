"""``env.name=custom`` and ``sft.expert``: the config records what a resume needs, the user's factory is built with
its ``env.kwargs``, the built-in experts get their env's knobs, and every mistake in the user's code is one line."""

from __future__ import annotations

import asyncio
import random
import shutil
import textwrap
from pathlib import Path

import pytest
import yaml

from harmonyrl.config import ConfigError, load_config
from harmonyrl.envs.loader import UserCodeError
from harmonyrl.tasks.calculator import CalculatorFactory, expert_demo
from harmonyrl.tasks.config import CalculatorEnvConfig, CustomEnvConfig, MazeEnvConfig
from harmonyrl.tasks.factory import check_before_compute, expert_for, make_factory

EXAMPLE = Path(__file__).parents[2] / "examples" / "unit_env.py"


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory holding a copy of the example as ``units.py``."""
    shutil.copy(EXAMPLE, tmp_path / "units.py")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _user_file(folder: Path, body: str) -> str:
    (folder / "mine.py").write_text("from units import UnitEnv, UnitFactory, convert, expert\n" + textwrap.dedent(body))
    return "mine.py"


def test_a_file_target_is_recorded_absolute_and_kwargs_keep_their_yaml_types(here: Path) -> None:
    cfg = load_config(None, ["env.name=custom", "env.factory=units.py:UnitFactory", "env.kwargs.max_value=3",
                             "env.kwargs.label=abc", "env.kwargs.flag=true", "sft.expert=units.py:expert"])  # fmt: skip
    assert cfg.env == CustomEnvConfig(
        factory=f"{here / 'units.py'}:UnitFactory", kwargs={"max_value": 3, "label": "abc", "flag": True}
    )
    assert [type(v) for v in cfg.env.kwargs.values()] == [int, str, bool]
    assert cfg.sft.expert == f"{here / 'units.py'}:expert"


def test_a_module_target_is_kept_as_written() -> None:
    cfg = load_config(None, ["env.name=custom", "env.factory=my_pkg.tasks:make_factory", "sft.steps=0"])
    assert isinstance(cfg.env, CustomEnvConfig) and cfg.env.factory == "my_pkg.tasks:make_factory"


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("nope.py:F", "config key 'env.factory': no such file: 'nope.py' (got 'nope.py:F')"),
        (
            "no_colon",
            "config key 'env.factory': expected MODULE:NAME or FILE.py:NAME, got 'no_colon' (got 'no_colon')",
        ),
    ],
)
def test_a_malformed_or_missing_target_is_a_config_error(here: Path, target: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(None, ["env.name=custom", f"env.factory={target}", "sft.steps=0"])
    assert str(e.value) == message


def test_a_custom_env_that_warm_starts_needs_an_expert_or_demonstrations(here: Path) -> None:
    env = CustomEnvConfig(factory="units.py:UnitFactory", kwargs={"max_value": 3})
    factory = make_factory(env, 0)
    with pytest.raises(UserCodeError) as e:
        asyncio.run(check_before_compute(env, factory, 0, sft_steps=1))
    assert str(e.value) == (
        "env.name=custom has no scripted expert for the SFT warm start: give sft.expert=module:fn "
        "(or file.py:fn), demonstrations (sft.demos=FILE), or sft.steps=0"
    )
    asyncio.run(check_before_compute(env, factory, 0, sft_steps=0))  # no warm start: nothing to demonstrate


def test_the_resolved_config_round_trips(here: Path) -> None:
    cfg = load_config(None, ["env.name=custom", "env.factory=units.py:UnitFactory", "env.kwargs.max_value=3",
                             "sft.expert=units.py:expert"])  # fmt: skip
    (here / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    elsewhere = here / "elsewhere"
    elsewhere.mkdir()
    import os

    os.chdir(elsewhere)  # a resume started from another folder reads the same files
    assert load_config(here / "config.yaml") == cfg


def test_the_factory_is_built_with_its_kwargs(here: Path) -> None:
    env = CustomEnvConfig(factory="units.py:UnitFactory", kwargs={"max_value": 3})
    factory = make_factory(env, seed=0)
    # values 1, 2 × 12 ordered unit pairs, less those that round to 0.00 (m -> km, m -> mile, cm -> km,
    # cm -> mile, for 1 and 2): 24 - 8 = 16 tasks, every 10th held out (ids 0 and 10); the factory has no validation
    # split, so ~10 % of the 14 others are carved from train as validation
    assert len(factory.tasks("train")) + len(factory.tasks("validation")) == 14
    assert [t.id for t in factory.tasks("test")] == ["units-0", "units-10"]


def test_memory_wraps_a_custom_env_too(here: Path) -> None:
    factory = make_factory(CustomEnvConfig(factory="units.py:UnitFactory", kwargs={"max_value": 3}, memory=True), 0)
    env = factory.make(factory.tasks("train")[0])
    assert {t.name for t in env.tools} == {"convert", "remember", "recall"}


def _custom_error(env: CustomEnvConfig) -> str:
    with pytest.raises(UserCodeError) as e:
        factory = make_factory(env, 0)
        asyncio.run(check_before_compute(env, factory, 0))
    assert "\n" not in str(e.value)
    return str(e.value)


def test_a_kwarg_the_factory_does_not_take_is_named(here: Path) -> None:
    target = f"{here / 'units.py'}:UnitFactory"
    message = _custom_error(CustomEnvConfig(factory="units.py:UnitFactory", kwargs={"difficulty": 3}))
    assert message == (
        f"env.kwargs.difficulty: env.factory '{target}' takes no argument 'difficulty' (it takes: max_value)"
    )


def test_a_required_argument_no_kwarg_gives_is_named(here: Path) -> None:
    _user_file(here, "def F(size):\n    return UnitFactory(size)\n")
    message = _custom_error(CustomEnvConfig(factory="mine.py:F"))
    assert message.endswith("missing a required argument: 'size' (give it as env.kwargs.NAME=VALUE; it takes: size)")


def test_a_module_that_is_not_there_is_named_with_the_target(here: Path) -> None:
    message = _custom_error(CustomEnvConfig(factory="my_pkg.tasks:make"))
    assert message == (
        "env.factory 'my_pkg.tasks:make': module 'my_pkg' not found (looked in the working directory and sys.path)"
    )


def test_a_missing_name_and_an_import_that_raises_are_one_line(here: Path) -> None:
    assert _custom_error(CustomEnvConfig(factory="units.py:Nope")).endswith("units.py' has no 'Nope'")
    _user_file(here, "import not_installed_anywhere\n")
    message = _custom_error(CustomEnvConfig(factory="mine.py:F"))
    assert "importing it raised ModuleNotFoundError: No module named 'not_installed_anywhere'" in message
    assert message.endswith("mine.py:2)")


def test_a_factory_that_raises_names_the_place(here: Path) -> None:
    _user_file(here, "def F():\n    raise RuntimeError('database not found')\n")
    message = _custom_error(CustomEnvConfig(factory="mine.py:F"))
    where = here / "mine.py"
    assert message.startswith(f"env.factory '{where}:F': building it raised RuntimeError: database not found (")
    assert message.endswith("mine.py:3)")


def test_a_factory_that_breaks_the_contract_names_the_rule(here: Path) -> None:
    _user_file(
        here,
        """
        class F(UnitFactory):
            def tasks(self, split):
                return [t for t in self._tasks if t.split == split == "train"]  # no held-out split
        """,
    )
    message = _custom_error(CustomEnvConfig(factory="mine.py:F"))
    assert message == f"env.factory '{here / 'mine.py'}:F' fails check_env: splits: test split is empty"


def test_expert_for_binds_the_envs_knobs() -> None:
    tasks = CalculatorFactory(0, 40, 1).tasks("train")
    for p_tool, p_verbose in ((0.0, 0.0), (1.0, 1.0), (0.8, 0.3)):
        expert = expert_for(CalculatorEnvConfig(p_tool=p_tool, p_verbose=p_verbose))
        got = [expert(t, random.Random(i)) for i, t in enumerate(tasks)]
        assert got == [expert_demo(t, random.Random(i), p_tool, p_verbose) for i, t in enumerate(tasks)]
    assert all(len(d) == 1 for d in [expert_for(CalculatorEnvConfig(p_tool=0.0))(t, random.Random(0)) for t in tasks])


def test_the_defaults_did_not_move() -> None:
    """The README's run: the scripted expert's knobs are what ``sft.p_tool`` / ``sft.p_verbose`` defaulted to."""
    default = load_config(None, [])
    assert isinstance(default.env, CalculatorEnvConfig)
    assert (default.env.p_tool, default.env.p_verbose) == (0.8, 0.3)
    assert (MazeEnvConfig().p_tool, MazeEnvConfig().p_verbose) == (0.8, 0.3)


def test_an_old_config_file_moves_the_knobs_and_an_old_override_points_to_the_new_key(tmp_path: Path) -> None:
    old = tmp_path / "config.yaml"
    old.write_text("sft:\n  steps: 7\n  p_tool: 0.6\n  p_verbose: 0.1\nenv:\n  name: calculator\n  n_test: 9\n")
    cfg = load_config(old)
    assert (cfg.sft.steps, cfg.env) == (7, CalculatorEnvConfig(n_test=9, p_tool=0.6, p_verbose=0.1))
    with pytest.raises(ConfigError, match=r"unknown config key 'sft.p_tool' \(did you mean 'env.p_tool'\?\)"):
        load_config(None, ["sft.p_tool=0.5"])


def test_the_users_expert_is_used_and_checked(here: Path) -> None:
    env = CustomEnvConfig(factory="units.py:UnitFactory", kwargs={"max_value": 3})
    task = make_factory(env, 0).tasks("train")[0]
    expert = expert_for(env, "units.py:expert")
    import units  # the example, as the loader imported it (its folder is on sys.path now)

    assert expert(task, random.Random(5)) == units.expert(task, random.Random(5))


@pytest.mark.parametrize(
    ("body", "target", "message"),
    [
        ("", "nothing_here:fn", "sft.expert 'nothing_here:fn': module 'nothing_here' not found"),
        ("fn = 3\n", "mine.py:fn", "mine.py:fn' is a int, not a callable"),
        ("def fn(task):\n    return []\n", "mine.py:fn", "must take (task, rng): too many positional arguments"),
        ("def fn(task, rng):\n    return None\n", "mine.py:fn", "returned a NoneType, not a list of Messages for task"),
        ("def fn(task, rng):\n    return [1]\n", "mine.py:fn", "returned a list holding something other than"),
        ("def fn(task, rng):\n    raise KeyError(task.id)\n", "mine.py:fn", "raised KeyError on task 'units-"),
    ],
)
def test_a_broken_expert_is_one_line(here: Path, body: str, target: str, message: str) -> None:
    _user_file(here, body)
    env = CustomEnvConfig(factory="units.py:UnitFactory", kwargs={"max_value": 3})
    factory = make_factory(env, 0)
    with pytest.raises(UserCodeError) as e:
        asyncio.run(check_before_compute(env, factory, 0, 1, target))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_demo_ending_on_a_tool_result_is_refused(here: Path) -> None:
    _user_file(here, "def fn(task, rng):\n    return expert(task, rng)[:2]\n")
    expert = expert_for(CustomEnvConfig(factory="units.py:UnitFactory"), "mine.py:fn")
    task = make_factory(CustomEnvConfig(factory="units.py:UnitFactory"), 0).tasks("train")[0]
    with pytest.raises(UserCodeError, match="does not end with a final answer or a tool call"):
        expert(task, random.Random(0))  # seed 0: the tool-using branch (a guess is one final message)


def test_splits_come_in_a_fixed_hash_order_unless_given_is_asked(here: Path) -> None:
    """The example lists its tasks by value: read as given, 60 RL steps would see only small values and the
    evaluation's first tasks would be the smallest. Hashed: a pseudo-random order, the same for every build."""
    given = make_factory(CustomEnvConfig(factory="units.py:UnitFactory", kwargs={"max_value": 30}, order="given"), 0)
    hashed = make_factory(CustomEnvConfig(factory="units.py:UnitFactory", kwargs={"max_value": 30}), 0)
    again = make_factory(CustomEnvConfig(factory="units.py:UnitFactory", kwargs={"max_value": 30}), 1)
    for split in ("train", "test"):
        ids = [t.id for t in given.tasks(split)]
        assert ids == sorted(ids, key=lambda i: int(i.split("-")[1]))  # the factory's own order: by value
        mixed = [t.id for t in hashed.tasks(split)]
        assert sorted(mixed) == sorted(ids) and mixed != ids  # the same tasks, reordered
        assert mixed == [t.id for t in again.tasks(split)]  # independent of the run's seed and of the build
    first_values = {int(t.prompt.split()[1]) for t in hashed.tasks("test")[:20]}
    assert max(first_values) > 20  # the evaluation's first tasks span the range, not its start
    assert hashed.name == "units" and len(hashed.box.specs) == 1  # anything else is the user's factory's
    assert asyncio.run(hashed.make(hashed.tasks("test")[0]).reset())[0].content.startswith("Convert ")


def test_an_earlier_runs_engine_keys_read_as_they_meant(tmp_path: Path) -> None:
    """A checkpoint recorded before the engine seam (rollout.max_batch, engine_dtype, engine_kernel,
    prefix_cache_mib) still loads: the keys move to rollout.engine; a value already there wins."""
    old = tmp_path / "config.yaml"
    old.write_text(
        "rollout:\n  max_batch: 32\n  engine_dtype: bfloat16\n  engine_kernel: torch\n  prefix_cache_mib: 8.0\n"
        "  group_size: 4\n"
    )
    engine = load_config(old).rollout.engine
    assert (engine.max_batch, engine.dtype, engine.kernel, engine.prefix_cache_mib) == (32, "bfloat16", "torch", 8.0)
    assert load_config(old).rollout.group_size == 4
    both = tmp_path / "both.yaml"
    both.write_text("rollout:\n  max_batch: 32\n  engine:\n    max_batch: 16\n")
    assert load_config(both).rollout.engine.max_batch == 16
    with pytest.raises(ConfigError, match=r"unknown config key 'rollout.max_batch'"):
        load_config(None, ["rollout.max_batch=8"])  # typed by the user now: the error names the new key
