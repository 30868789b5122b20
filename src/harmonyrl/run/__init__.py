"""What a run is built from and lives in, whatever its phases.

- ``setup``: the composition root (process, run folder, writers, env facts, model, engine).
- ``folder``, ``context``, ``hooks``: the run folder, what every phase reads and writes through, callbacks.
- ``checkpoint``, ``checkpoint_files``, ``resume``, ``state``, ``clock``: atomic checkpoints, lossless resume and
  the typed run state it restores, the wall clock across resumes.
- ``failure``: how a run that fails after its folder exists says so.
- ``evaluate``, ``eval_env``: held-out evaluation, and which env ``eval --checkpoint`` runs.
- ``ranks``: opening a run under torchrun.
"""
