"""Environments no one here wrote, run as their packages ship them (issue 40).

One module per ecosystem, each importing its package lazily (an optional extra: ``pip install
'harmonyrl[reasoning-gym]'``), plus the pieces they share, one idea per module: :mod:`.splits` (disjoint
train / validation / test draws from a procedural generator), :mod:`.guard` (the checks every foreign grader
gets before its score counts), :mod:`.packages` (an optional package, imported with a one-line error).
"""
