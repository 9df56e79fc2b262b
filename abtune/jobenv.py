"""What a rank knows of the job it runs in, in abtune's own environment variables.

The launcher that starts a rank exports them (`Launcher.rank_identity`: its scheduler's variables, such as
the one naming the job, copied into these), so a rank reads only these (dist.py, tracking/hook.py) and never
names a scheduler. A leaf: the lowest layers read it.
"""

from __future__ import annotations

import os

NODE_RANK = "ABTUNE_NODE_RANK"  # the node of this rank (0, 1, ...): real on a cluster, simulated locally
NODE_NAME = "ABTUNE_NODE_NAME"  # the scheduler's name of this rank's node (the one to drain)
JOB_KIND = "ABTUNE_JOB_KIND"  # the launcher kind of the job this rank runs in
JOB_ID = "ABTUNE_JOB_ID"  # that job's id, as its scheduler names it
JOB_VARIABLES = (NODE_NAME, JOB_KIND, JOB_ID)  # what one job's rank must not pass on to another's


def job() -> tuple[str, str] | None:
    """The kind and id of the job this rank runs in; None for a rank of no scheduler's job (local, debug)."""
    kind, job_id = os.environ.get(JOB_KIND), os.environ.get(JOB_ID)
    return (kind, job_id) if kind and job_id else None


def job_param() -> tuple[str, str] | None:
    """The run parameter that records the job (`KIND_job_id`); None outside a scheduler's job."""
    found = job()
    return (f"{found[0]}_job_id", found[1]) if found else None
