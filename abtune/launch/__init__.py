"""Launchers: how the ranks of a run start (local processes, in-process debug, SLURM via submitit).

The interface is `base.Launcher` and `base.Job`; `launchers.load_launcher(NAME|PATH)` builds one from
its profile (profiles.py), `launchers.reattach` follows a job another process submitted. Helpers beside
them: local.py, warm.py, fabric.py, slurm.py (also `submit_array` for study workers), follow.py.
"""
