"""harmonyrl: agentic reinforcement learning for GPT-OSS-style models."""

import os

# MKL's strict conditional-numerical-reproducibility mode: its matrix products then give the same bits whatever
# the number of threads (docs/contention.md), so a run's numbers do not depend on how loaded the machine is when
# the thread team follows the free cores (``adaptive_threads``, the default). MKL reads it at its first product,
# so it is set on import, before any; a value the user set is kept. It costs nothing measurable here.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

__version__ = "0.1.0"
