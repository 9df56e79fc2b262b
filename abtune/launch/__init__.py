"""Launchers: how the ranks of a run start (local processes, in-process debug, SLURM via submitit).

Public entry points: `profiles.load_profile` / `profiles.Layout`, and `submit.submit_run`, `submit.attach`,
`submit.outcome`, `submit.wait` (every launcher), `slurm.submit_array` (job arrays of study workers).
"""
