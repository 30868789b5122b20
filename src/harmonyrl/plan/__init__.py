"""Capacity planning: what a run will need and cost on given hardware, before anyone rents it.

:mod:`.hardware` holds the accelerators' figures (and measures this machine's); :mod:`.model_size` names the
model a plan is for; :mod:`.estimate` turns a run config into memory per device (the trainer's memory model,
:mod:`harmonyrl.learn.footprint`), the smallest layout that fits, throughput bounds, step time, run time and
cost. ``harmonyrl plan`` (:mod:`harmonyrl.cli.plan`) prints it. The formulas and what they leave out: docs/plan.md.
"""
