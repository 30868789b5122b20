"""An external environment's own code is recorded with the run (``env.env_version``) and other code at a resume or an
eval is a one-line error: a distribution's version where the module was installed, a hash of its source where it is
imported from a folder (docs/verifiers.md, docs/openenv.md)."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from harmonyrl.config import ConfigError, load_config
from harmonyrl.tasks.ecosystems.packages import module_version

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def local_package(root: Path, source: str) -> None:
    (root / "my_env").mkdir(parents=True, exist_ok=True)
    (root / "my_env" / "__init__.py").write_text("")
    (root / "my_env" / "rules.py").write_text(source)


def test_an_installed_module_is_its_distributions_version() -> None:
    assert module_version("openenv.core") == f"openenv-core {importlib.metadata.version('openenv-core')}"
    assert module_version("textarena.envs") == f"TextArena {importlib.metadata.version('textarena')}"


def test_a_module_from_a_folder_is_the_hash_of_its_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    local_package(tmp_path, "REWARD = 1\n")
    first = module_version("my_env.rules")
    assert first.startswith("source sha256:") and len(first) == len("source sha256:") + 12
    assert module_version("my_env") == first  # the whole top-level package, whichever module is named
    local_package(tmp_path, "REWARD = 2\n")  # an edit of the rules is other code
    assert module_version("my_env.rules") != first
    (tmp_path / "my_env" / "rules.py").rename(tmp_path / "my_env" / "scoring.py")  # so is a renamed file
    assert module_version("my_env") not in (first,)
    single = tmp_path / "env_file.py"
    single.write_text("X = 1\n")
    assert module_version("env_file") == module_version(str(single))  # a module file, by name or by path
    assert module_version("no_such_env_module") == "not importable"
    assert module_version(str(tmp_path / "missing.py")) == "not importable"


@pytest.mark.parametrize(
    ("folder", "fields"),
    [
        ("verifiers_envs", ["env.name=verifiers", "env.id=vf_sum"]),
        ("openenv_envs", ["env.name=openenv", "env.client=guess_env:GuessEnv", "env.app=guess_env.server.app:app"]),
    ],
)
def test_the_config_records_the_envs_code_and_refuses_other_code(
    folder: str, fields: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("verifiers.v1" if folder == "verifiers_envs" else "openenv.core")
    monkeypatch.syspath_prepend(str(EXAMPLES / folder))
    recorded = load_config(None, fields).env.env_version  # type: ignore[union-attr]
    top = "vf_sum" if folder == "verifiers_envs" else "guess_env"
    assert recorded == module_version(top) and recorded.startswith("source sha256:")
    assert load_config(None, [*fields, f"env.env_version={recorded}"]).env == load_config(None, fields).env  # resume
    with pytest.raises(ConfigError, match=r"this run was made with env\.\w+=\S+ at source sha256:0123, but it is "):
        load_config(None, [*fields, "env.env_version=source sha256:0123"])
