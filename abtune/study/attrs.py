"""The names of the attributes abtune keeps on Optuna trials and studies: one home for each, so the
runner, the report, promote and the trackers read what the others wrote.

Trial user attributes; the result keys (top1, inter_node_bytes, ...) are `study.results.RESULT_KEYS`.
"""

from __future__ import annotations

from abtune.objectives import EVALUATIONS_ATTR  # {step: {objective: value}}: the trial's evaluations
from abtune.tracking._base import RUN_ID_ATTR

# --- on a trial ---
REFERENCE_ATTR = "reference"  # a reference trial's role: PAPER_DEFAULTS or DDP (study.definition)
ATTEMPT_ATTR = "attempt"  # how many times this configuration was tried before (0: first)
RETRY_OF_ATTR = "retry_of"  # the number of the failed trial this one repeats
RETRIED_ATTR = "retried"  # a failed trial whose retry was enqueued: it does not count against the budget
OVER_BUDGET_ATTR = "over_budget"  # asked for while another worker took the budget's last trial: never run
FAIL_REASON_ATTR = "fail_reason"  # one line: why the trial failed
RUN_DIR_ATTR = "run_dir"  # the trial's run folder
SEEDS_ATTR = "seeds"  # the seeds of a trial with repeats
REUSED_SEEDS_ATTR = "reused_seeds"  # seeds whose finished runs an earlier attempt left
SEED_JOBS_ATTR = "seed_jobs"  # {seed: {kind, record, run_id}}: each seed's job, for a later runner to follow
SLURM_JOB_ATTR = "slurm_job_id"  # the SLURM job that trains the trial
LOCAL_JOB_ATTR = "local_job"  # the local launch (host, process) that trains the trial
# where a trial records its job, by Job.kind (what a later runner follows); debug jobs are not recorded
JOB_ATTRS = {"local": LOCAL_JOB_ATTR, "slurm": SLURM_JOB_ATTR}
LAUNCHER_ATTR = "launcher"  # the `--launcher NAME|PATH` the trial ran with

# --- on a study ---
SPEC_ATTR = "abtune.spec"  # the study file's definition as created
STUDY_DIR_ATTR = "abtune.study_dir"  # where the trials' run folders live
CONFIRMATION_ATTR = "abtune.confirmation"  # written by `abtune study confirm`, one record per trial
ARTIFACTS_AT_ATTR = "abtune:study_artifacts_at"  # when a runner last rebuilt the study's plots (time.time())
ARTIFACTS_COST_ATTR = "abtune:study_artifacts_cost_s"  # how long that rebuild took (wall seconds)

__all__ = [
    "ARTIFACTS_AT_ATTR", "ARTIFACTS_COST_ATTR", "ATTEMPT_ATTR", "CONFIRMATION_ATTR", "EVALUATIONS_ATTR", "FAIL_REASON_ATTR", "JOB_ATTRS", "LAUNCHER_ATTR", "LOCAL_JOB_ATTR", "OVER_BUDGET_ATTR", "REFERENCE_ATTR",
    "RETRIED_ATTR", "RETRY_OF_ATTR", "REUSED_SEEDS_ATTR", "RUN_DIR_ATTR", "RUN_ID_ATTR", "SEEDS_ATTR", "SEED_JOBS_ATTR",
    "SLURM_JOB_ATTR", "SPEC_ATTR", "STUDY_DIR_ATTR",
]
