"""The bundled environments and their scripted experts, one file each, built on :mod:`harmonyrl.envs`.

``config.py`` is the typed union of their configs and ``factory.py`` builds one from its config.
"""
