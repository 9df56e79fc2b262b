"""Optuna studies: search AB-training hyperparameters, each trial a run on any launcher.

The study file: spec.py, space.py (search space -> run-config overrides), options.py (sampler and
pruner options); where studies live: storage.py, definition.py (stored definition, sampler,
pruner), lifecycle.py (create, delete). Running: runner.py (ask -> run -> tell, P trials at a
time), pool.py, trials.py (one trial's run), repeats.py (seed repeats), reattach.py (a dead
worker's trial jobs), retries.py, workers.py (which worker owns a trial), stop.py (`study stop`),
worker_array.py (`study launch`), pruning.py (the rank-0 hook), pareto_pruner.py. Reading: results.py,
ranking.py, importance.py, curves.py, stats.py, confirm.py, live_view.py (the live view), report/ (status,
best, export: one module per thing shown);
cli.py (`abtune study ...`).
"""
