"""User-facing error types, importable without torch so the CLI can catch them cheaply."""


class CheckpointError(ValueError):
    """A checkpoint folder that is missing, incomplete, corrupt or does not fit the tokenizer."""
