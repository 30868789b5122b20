"""What every learner shares (RL, soft-Q, SFT, reward-model training).

- ``batch``: trajectories to padded tensors; scoring token ids with the trainer's model.
- ``token_scores``: log-probs and entropies of target tokens, chunked over the vocabulary.
- ``device``: where tensors live (``device=auto|cpu|cuda``) and in what precision (fp32 / bf16 autocast).
- ``optimizer_step``: one optimizer step (zero, loss closure, FSDP-aware clip, guards, step) and a scaled lr.
- ``guards``: stability guards and the snapshot a tripped guard rolls back to.
- ``update_result``: the typed answer an update gives the loop.
- ``footprint``: the analytic memory model of an RL run (``harmonyrl plan`` reads it too).
"""
