"""One module per job a command runs, composed from the phases below it.

``train`` (``harmonyrl train``: SFT, held-out eval, RL, held-out eval), ``compare``, ``check_mismatch``,
``replay``, ``rm_pairs`` and ``rm_train`` (``harmonyrl rm pairs|train``), ``export_demos``.
"""
