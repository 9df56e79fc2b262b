"""RPCs the SLURM daemons served, by message type: slurmctld's from `sdiag`, slurmdbd's from
`sacctmgr show stats`; both reset to zero by `reset()` (root or SlurmUser). The independent count
behind the RPC budget of a study's polling (squeue reaches slurmctld, sacct reaches slurmdbd)."""

from __future__ import annotations

import re
import subprocess

HEADER = "Remote Procedure Call statistics by message type"
_COUNT = re.compile(r"^\s*([A-Z][A-Z0-9_]+)\s+\(\s*\d+\)\s+count:\s*(\d+)", re.M)
# the RPCs squeue sends: one job, one user's jobs, every job
JOB_INFO = ("REQUEST_JOB_INFO", "REQUEST_JOB_INFO_SINGLE", "REQUEST_JOB_USER_INFO")
SACCT = "DBD_GET_JOBS_COND"  # what sacct (and submitit's job watcher) asks slurmdbd


def reset() -> None:
    subprocess.run(["sdiag", "--reset"], check=True, capture_output=True, timeout=30)
    subprocess.run(["sacctmgr", "-i", "clear", "stats"], check=True, capture_output=True, timeout=30)


def controller() -> dict[str, int]:
    return _by_type(subprocess.run(["sdiag"], check=True, capture_output=True, text=True, timeout=30).stdout)


def database() -> dict[str, int]:
    out = subprocess.run(["sacctmgr", "show", "stats"], check=True, capture_output=True, text=True, timeout=30).stdout
    return _by_type(out)


def _by_type(report: str) -> dict[str, int]:
    section = report.split(HEADER, 1)[1].split("Remote Procedure Call statistics by user", 1)[0]
    return {name: int(count) for name, count in _COUNT.findall(section)}


def job_info(counts: dict[str, int]) -> int:
    return sum(counts.get(name, 0) for name in JOB_INFO)
