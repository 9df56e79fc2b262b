"""Optuna studies: search AB-training hyperparameters over local (and later SLURM) trials.

spec.py (the study file), space.py (search space -> run-config overrides), storage.py (URLs),
definition.py (stored definition, sampler, pruner), lifecycle.py (create, delete), runner.py
(ask -> run -> tell), workers.py (stale trials), pruning.py (the rank-0 hook), results.py,
report.py, display.py, cli.py (`abtune study ...`).
"""
