"""Environments no one here wrote, run as their packages ship them (issue 40).

One adapter per ecosystem, each importing its package lazily (an optional extra: ``pip install
'harmonyrl[reasoning-gym]'``, ``[verifiers]``, ``[textarena]``, ``[openenv]``), its ``env`` config in a light module of
its own (``*_config.py``, what :mod:`harmonyrl.tasks.config` puts in the ``EnvConfig`` union):

* :mod:`.reasoning_gym` (+ :mod:`.reasoning_gym_datasets`): reasoning-gym's procedural tasks and graders;
* :mod:`.verifiers` (+ :mod:`.verifiers_tools`, :mod:`.verifiers_trace`): an installed verifiers v1 environment,
  harmonyrl playing its ``null`` harness;
* :mod:`.textarena`: a single-player TextArena game, moved with a tool;
* :mod:`.openenv` (+ :mod:`.openenv_server`): an OpenEnv environment over HTTP/WebSocket, its typed action a tool.

And the pieces they share, one idea per module: :mod:`.splits` (disjoint train / validation / test by a hash of a
task's canonical key), :mod:`.guard` (the checks a foreign grader's score must get past), :mod:`.packages` (an
optional package, imported with a one-line error naming its extra). Docs: docs/reasoning-gym.md,
docs/verifiers.md, docs/textarena.md, docs/openenv.md; measured rows: benchmarks/external.py.
"""
