"""User-facing error types, importable without torch so the CLI can catch them cheaply.

Every failure caused by the user's input or set-up derives from :class:`UserError` (its layer's own error keeps its
builtin base too, ``ValueError`` mostly, for the code that catches that): the CLI prints one line for any of them
and a traceback for nothing that is one. The sandbox, a leaf that imports nothing of harmonyrl, keeps its own
``SandboxUnavailable``, which the CLI names beside this class.
"""


class UserError(Exception):
    """A failure caused by the user's input or set-up, reported as one line (no traceback)."""


class CheckpointError(UserError, ValueError):
    """A checkpoint folder that is missing, incomplete, corrupt or does not fit the tokenizer."""


class KernelUnavailable(UserError, ValueError):
    """``rollout.engine.kernel=native`` asked for where the compiled decode step cannot run (not built, bf16, ...)."""


class NotDemonstrable(UserError, ValueError):
    """A task the environment's scripted expert cannot demonstrate (e.g. one from a user's ``tasks_file``, which
    no generator template matches), so it cannot be used for the SFT warm start."""


class NoHeldOutTasks(UserError, ValueError):
    """The environment has no held-out (``test``) tasks, so there is nothing to evaluate (not a 0 % success)."""


class DemoFileError(UserError, ValueError):
    """An ``sft.demos`` file that cannot be read at all (missing, wrong format, no ``messages`` column) or holds
    no usable demonstration, or a tool result that disagrees with ``sft.demos_on_mismatch=error``."""


class ClusterError(UserError, ValueError):
    """The Ray cluster asked for (``scale.*``) cannot be used: not installed, not answering, or too small."""


class EngineUnavailable(UserError, ValueError):
    """The configured inference server cannot be used: unreachable, serving another model, or lacking a route."""
