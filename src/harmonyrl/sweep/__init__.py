"""``harmonyrl sweep``: hyperparameter search over any config field with Optuna (docs/sweeps.md).

``space`` parses and checks the search space, ``runner`` runs one trial as a ``harmonyrl train`` subprocess,
``study`` asks Optuna for trials and runs them in parallel, ``outputs`` writes the table, plot and best config.
"""
