"""Test-session set-up shared by every test: the process mode that ``harmonyrl`` commands run in.

``setup_process`` (every CLI command) turns on torch's deterministic algorithms; tests that call trainer
pieces directly must run in that mode too, or they test something the product never runs. It matters:
the backward of an indexed gather (``bias[expert_ids]`` in transformers' grouped MoE experts) accumulates
in a thread-timing-dependent order otherwise, measured at 1 in 3000 backward passes differing in the last
bit on an idle 2-core machine and 129 in 3000 with both cores busy.
"""

import torch

torch.use_deterministic_algorithms(True, warn_only=True)
