"""Checkpoints carry their tokenizer: ``AutoTokenizer`` + ``AutoModelForCausalLM.from_pretrained(ckpt)`` work, the
transformers tokenizer gives harmonyrl's ids on harmony-rendered text, and the README's snippet runs as written."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harmonyrl.config import load_config
from harmonyrl.harmony import HarmonyTokenizer, render_prompt, system_message
from harmonyrl.harmony.tokenizer import HARMONY_SPECIALS
from harmonyrl.models.tiny_gpt_oss import build_config, build_model
from harmonyrl.run.checkpoint import save_checkpoint
from harmonyrl.run.checkpoint_files import RUN_CONFIG_FILE, CheckpointFiles
from harmonyrl.sft.train import build_demos
from harmonyrl.tasks.factory import expert_for, make_factory
from harmonyrl.types import Message

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tok = HarmonyTokenizer.load_default()
    model = build_model(build_config("nano", tok.vocab_size, tok.special.endoftext, tok.special.return_), seed=0)
    folder = tmp_path_factory.mktemp("run") / "checkpoints" / "final"
    return save_checkpoint(folder, model, None, 0, {}, CheckpointFiles(load_config(None, []), tok))


def test_checkpoint_loads_with_plain_transformers(ckpt: Path, tok: HarmonyTokenizer) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", RUN_CONFIG_FILE):
        assert (ckpt / name).is_file(), name
    hf = AutoTokenizer.from_pretrained(ckpt)
    model = AutoModelForCausalLM.from_pretrained(ckpt)
    assert model.config.vocab_size == len(hf) == tok.vocab_size
    assert hf.eos_token_id == tok.special.return_ and hf.pad_token_id == tok.special.endoftext
    assert [hf.convert_tokens_to_ids(t) for t in HARMONY_SPECIALS] == list(range(len(HARMONY_SPECIALS)))
    mapping = json.loads((ckpt / "special_tokens_map.json").read_text())
    assert mapping["eos_token"] == "<|return|>" and "<|call|>" in mapping["additional_special_tokens"]
    assert "sft:" in (ckpt / RUN_CONFIG_FILE).read_text()  # the resolved run config rides along


def _hf(ckpt: Path) -> object:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(ckpt)


@pytest.mark.parametrize("env", ["calculator", "maze", "sql", "instruct"])
def test_transformers_ids_equal_harmonyrl_ids_on_rendered_episodes(ckpt: Path, tok: HarmonyTokenizer, env: str) -> None:
    """Whole expert episodes (system, developer with tool schemas, user, tool calls, tool results, final answer),
    rendered by harmonyrl, decoded to text and re-tokenized by the checkpoint's transformers tokenizer."""
    hf = _hf(ckpt)
    cfg = load_config(None, [f"env.name={env}", "env.n_train=6", "env.n_test=2", "env.p_tool=1.0", "env.p_verbose=0.5"])
    factory = make_factory(cfg.env, 0)
    demos = asyncio.run(build_demos(tok, factory, expert_for(cfg.env), factory.tasks("train"), 0))
    assert demos
    for demo in demos:
        text = tok.decode(demo.ids)
        assert "<|call|>" in text or env == "instruct"  # tool calls are covered where the env has tools
        assert hf(text, add_special_tokens=False).input_ids == list(demo.ids)  # type: ignore[operator]


@settings(max_examples=60, deadline=None)
@given(user=st.text(max_size=40).filter(lambda s: "<|" not in s))
def test_transformers_ids_equal_harmonyrl_ids_on_any_user_text(ckpt: Path, tok: HarmonyTokenizer, user: str) -> None:
    """Any user text without control-token look-alikes (which transformers would parse as control tokens)."""
    ids = render_prompt(tok, [system_message(), Message("user", user)])
    assert _hf(ckpt)(tok.decode(ids), add_special_tokens=False).input_ids == ids  # type: ignore[operator]


def test_readme_snippet_runs_and_renders_harmonyrls_prompt(ckpt: Path, tok: HarmonyTokenizer) -> None:
    text = README.read_text()
    block = re.search(r"<!-- transformers-snippet -->\n```python\n(.*?)```", text, re.S)
    assert block is not None, "README lost its transformers snippet"
    code = block.group(1)
    assert 'ckpt = "runs/demo/checkpoints/final"' in code
    scope: dict[str, object] = {}
    exec(code.replace('"runs/demo/checkpoints/final"', repr(str(ckpt))), scope)  # the README we ship
    expected = render_prompt(
        tok, [system_message(model_identity=None, knowledge_cutoff=None), Message("user", "What is 12 + 30?")]
    )
    assert scope["ids"].tolist() == [expected]  # type: ignore[attr-defined]
    parsed = scope["parsed"]
    assert hasattr(parsed, "messages") and hasattr(parsed, "error")
