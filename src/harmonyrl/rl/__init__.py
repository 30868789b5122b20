"""The RL phase: a step's episodes in, an update out.

- ``phase``: the phase top to bottom (rollouts with the current policy → the update → checkpoints).
- ``collect``, ``pipeline``, ``task_choice``, ``reward_setup``: drawing and running a step's episodes, now or ahead
  with bounded staleness, from a plain stream or a curriculum, scored by the ``reward`` section.
- ``learner``: everything a step updates and the one call the phase makes; ``update`` (the PPO family, with
  ``targets`` and ``figures``), ``soft_q`` with its ``replay_buffer``; ``reference``, ``routing_replay``,
  ``distill_teacher``: what an update reads besides the batch.
- ``fault_breaker``, ``skipped_updates``: what steers or stops the phase, said out loud.
"""
