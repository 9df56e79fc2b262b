"""Grid Engine (SGE, Son of Grid Engine, Open Grid Scheduler): one job per run through qsub.

profile.py is the `kind: gridengine` profile, commands.py wraps qsub/qstat/qacct/qdel, launcher.py
writes the job script and follows the job, ranks.py is what the job runs: the run's ranks on its host.
"""

from abtune.launch.gridengine.launcher import GridEngineJob, GridEngineLauncher
from abtune.launch.gridengine.profile import GridEngineProfile

__all__ = ["GridEngineJob", "GridEngineLauncher", "GridEngineProfile"]
