"""docs/envs.md and the README's env table keep up with the code: every env, constraint kind and browse question."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import get_args

from harmonyrl.tasks.browse import QUESTIONS
from harmonyrl.tasks.config import EnvConfig
from harmonyrl.tasks.constraints import KINDS, from_json, validate
from harmonyrl.tasks.web import corpus

ROOT = Path(__file__).parents[2]
DOC = (ROOT / "docs" / "envs.md").read_text()


def test_readme_env_table_has_every_builtin_env_and_links_the_doc() -> None:
    readme = (ROOT / "README.md").read_text()
    rows = set(re.findall(r"^\| `(\w+)`", readme, re.MULTILINE))
    names = {cls.model_fields["name"].default for cls in get_args(get_args(EnvConfig)[0])}
    assert names <= rows, names - rows
    assert "(docs/envs.md" in readme


def test_every_constraint_kind_is_documented_with_a_working_example() -> None:
    for kind in KINDS:
        assert f"| `{kind}` |" in DOC, kind
    example = json.loads(re.search(r'\{"id": "if-1".*?\]\}', DOC, re.DOTALL).group(0))  # type: ignore[union-attr]
    validate([from_json(c) for c in example["constraints"]])


def test_every_browse_question_template_is_documented_and_the_example_is_right() -> None:
    for q in QUESTIONS.values():
        assert q.template.replace("{name}", "{" + q.kind + "}") in DOC, q.template
    example = json.loads(re.search(r'\{"id": "b-1".*\}', DOC).group(0))  # type: ignore[union-attr]
    company = example["prompt"].removeprefix("Who founded ").removesuffix("?")
    assert corpus().companies[company].founder == example["answer"]
