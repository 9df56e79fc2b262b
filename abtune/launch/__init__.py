"""Launchers: where the ranks of a run start (local processes, in-process debug, a cluster's scheduler).

The interface is `base.Launcher` (a small core) and `base.Job`, with optional capabilities (`JobQueue`,
`StudyWorkers`); `launchers.LAUNCHER_TYPES` is the registry, `launchers.load_launcher(NAME|PATH)` builds one
from its profile, `launchers.reattach` follows a job another process submitted. Helpers beside them:
local.py, warm.py, fabric.py, follow.py; SLURM is the package slurm/.
"""
