"""The files of a reward model folder, named apart from the model so the config can check a folder without importing
transformers (``--help`` and config errors stay instant)."""

META_FILE = "reward_model.json"
"""Format, tokenizer and the longest input."""
HEAD_FILE = "reward_head.safetensors"
"""The scalar head's weight and bias."""
FORMAT = "harmonyrl-reward-model/1"
