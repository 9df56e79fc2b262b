"""Reading a study, one module per thing shown: status.py (`study status`), best.py (`study best`: the
recommendation and the Pareto front) over tables.py (the trial tables), importances.py (parameter
importances), rerun.py (the command that runs a trial again), export.py (`study export`, `study list`).
Imports point down that list: status reads best, best reads the tables, importances and rerun."""
