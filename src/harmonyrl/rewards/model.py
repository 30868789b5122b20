"""A reward model: the GPT-OSS trunk and a scalar head on the hidden state of the answer's last token.

What it reads (:func:`answer_ids`): the prompt messages rendered up to ``<|start|>assistant``, then the answer as
the policy samples it, so the last token is the ``<|return|>`` that closes the ``final`` message. Pairs from a file
and episodes from a run are rendered the same way (no system or developer message: a pair file has none), so the
model scores an episode exactly as it was trained to score an answer.

Batches are right-padded and the score is read at each row's own last token; attention is causal and the MoE
routes every token on its own, so a row's score does not depend on what it is batched with (tested).

The checkpoint is a folder loadable on its own by :func:`load_reward_model`: the trunk as a plain gpt-oss checkpoint
(``config.json`` + ``model.safetensors``, its unused LM head included so any gpt-oss loader reads it), the head in
``reward_head.safetensors``, and ``reward_model.json`` (format, tokenizer, the longest input).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import GptOssForCausalLM

from harmonyrl.errors import CheckpointError
from harmonyrl.harmony.codecs import TokenizerName
from harmonyrl.harmony.render import render_completion, render_prompt
from harmonyrl.harmony.tokenizer import Codec
from harmonyrl.models.tiny_gpt_oss import load_model, save_model
from harmonyrl.rewards.files import FORMAT, HEAD_FILE, META_FILE
from harmonyrl.types import Message


def answer_ids(codec: Codec, prompt: Sequence[Message], answer: Sequence[Message], max_len: int) -> list[int]:
    """The ids the reward model reads for ``answer`` after ``prompt``; longer than ``max_len``, the oldest prompt
    tokens are cut (the answer's end is what is scored)."""
    ids = render_prompt(codec, prompt, next_role="assistant") + render_completion(codec, answer)
    return ids[-max_len:]


class RewardModel(torch.nn.Module):
    """``lm``'s trunk (``lm.model``) and a ``Linear(hidden, 1)`` head; ``forward`` gives one score per row."""

    def __init__(self, lm: GptOssForCausalLM, tokenizer: TokenizerName, max_len: int, seed: int = 0) -> None:
        super().__init__()
        self.lm = lm
        self.tokenizer: TokenizerName = tokenizer
        self.max_len = max_len
        self.pad_id = int(lm.config.pad_token_id or 0)
        hidden = int(lm.config.hidden_size)
        self.head = torch.nn.Linear(hidden, 1)
        with torch.random.fork_rng():  # TRL's init: N(0, 1/sqrt(hidden + 1)), bias 0
            torch.manual_seed(seed)
            torch.nn.init.normal_(self.head.weight, std=1 / (hidden + 1) ** 0.5)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Scores ``[B]`` of right-padded ``ids`` ``[B, T]`` (``attention_mask`` ``[B, T]``, 1 on real tokens)."""
        hidden = self.lm.model(input_ids=ids, attention_mask=attention_mask).last_hidden_state  # [B, T, H]
        last = attention_mask.sum(dim=1) - 1  # each row's last real token
        picked = hidden[torch.arange(ids.shape[0], device=ids.device), last]  # [B, H]
        scores: torch.Tensor = self.head(picked).squeeze(-1)
        return scores

    def batch(self, rows: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-padded ids and attention mask ``[B, T]`` of ``rows`` (each non-empty)."""
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
            mask[i, : len(r)] = 1
        device = self.head.weight.device
        return ids.to(device), mask.to(device)

    @torch.no_grad()
    def score(self, rows: Sequence[Sequence[int]], batch_size: int = 16) -> list[float]:
        """Scores of ``rows`` (token ids, as :func:`answer_ids` makes them), ``batch_size`` rows per forward."""
        was_training = self.training
        self.eval()
        out: list[float] = []
        for start in range(0, len(rows), batch_size):
            out.extend(self(*self.batch(rows[start : start + batch_size])).float().tolist())
        self.train(was_training)
        return out


def save_reward_model(model: RewardModel, path: Path) -> Path:
    """Write the checkpoint folder ``path`` (replaced if it exists), atomically: a temporary folder renamed."""
    tmp = path.with_name(path.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    save_model(model.lm, tmp)
    save_file({k: v.detach().contiguous().cpu() for k, v in model.head.state_dict().items()}, tmp / HEAD_FILE)
    meta = {"format": FORMAT, "tokenizer": model.tokenizer, "max_len": model.max_len}
    (tmp / META_FILE).write_text(json.dumps(meta, indent=2))
    if path.exists():
        shutil.rmtree(path)
    tmp.rename(path)
    return path


def load_reward_model(path: Path) -> RewardModel:
    """The reward model saved in ``path`` (fp32, eval mode); a one-line :class:`CheckpointError` if it is not one."""
    meta_path = Path(path) / META_FILE
    if not meta_path.is_file() or not (Path(path) / HEAD_FILE).is_file():
        raise CheckpointError(f"'{path}' is not a reward model folder (no {META_FILE} and {HEAD_FILE})")
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"'{meta_path}' is not readable JSON: {e}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"'{meta_path}' is not a {FORMAT} file")
    model = RewardModel(load_model(Path(path)), meta["tokenizer"], int(meta["max_len"]))
    model.head.load_state_dict(load_file(Path(path) / HEAD_FILE))
    return model.eval()
