"""The names abtune keeps on Optuna trials and studies: one home for each, so the runner, the reports,
promote and the trackers read what the others wrote. A leaf: every layer reads it.

A trial's user attributes carry no prefix: they are what `study export`, optuna-dashboard and a user's
own Optuna code show (its results are `study.results.RESULT_KEYS`, one per objective among them).
abtune's own bookkeeping on studies and trials (system attributes) starts with `abtune.`. Studies
written by earlier versions still read as they were written: some bookkeeping was named `abtune:...`,
and `stored` falls back to that.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PREFIX = "abtune."

# --- a trial's user attributes ---
REFERENCE_ATTR = "reference"  # a reference trial's role: PAPER_DEFAULTS or DDP
PAPER_DEFAULTS = "paper-defaults"  # the paper's guideline configuration, inside the search space
DDP = "ddp"  # plain DDP in the search's layout, outside the search space: the traffic reference
WARM_START_ATTR = "warm_start_of"  # `OLD #N`: the trial of another study this enqueued trial starts from
ATTEMPT_ATTR = "attempt"  # how many times this configuration was tried before (0: first)
RETRY_OF_ATTR = "retry_of"  # the number of the failed trial this one repeats
RETRIED_ATTR = "retried"  # a failed trial whose retry was enqueued: it does not count against the budget
OVER_BUDGET_ATTR = "over_budget"  # asked for while another worker took the budget's last trial: never run
FAIL_REASON_ATTR = "fail_reason"  # one line: why the trial failed
RUN_DIR_ATTR = "run_dir"  # the trial's run folder
RUN_ID_ATTR = "mlflow_run_id"  # the trial's MLflow run
LAUNCHER_ATTR = "launcher"  # the `--launcher NAME|PATH` the trial ran with
# {kind, record, run_id}: the job that trains the trial, as its launcher records it (launch.launchers.job_entry),
# for a later runner to follow; a job that ends with its runner (debug) is not recorded
JOB_ATTR = "job"
SEEDS_ATTR = "seeds"  # the seeds of a trial with repeats
REUSED_SEEDS_ATTR = "reused_seeds"  # seeds whose finished runs an earlier attempt left
SEED_JOBS_ATTR = "seed_jobs"  # {seed: {kind, record, run_id}}: each seed's job, for a later runner to follow
# {step: {objective: value at that evaluation}} (a repeated trial: the mean over its seeds so far), written by
# the trial's hook (study/pruning.py); the pruner and the plots read it.
EVALUATIONS_ATTR = "evaluations"
TRAFFIC_EXCESS_ATTR = "traffic_excess_mb"  # inter-node MB over the study's traffic budget (its constraint)
# What AB decided, for telling a searched parameter that changed nothing (study/importance.py): the ranks of
# the first decomposition ({} when nothing was factored, None for a method that never decomposes) and
# AB's schedule in steps.
FIRST_RANKS_ATTR = "first_ranks"
SCHEDULE_ATTR = "schedule_steps"

# --- a trial's system attributes ---
WORKER_ATTR = PREFIX + "worker"  # {host, pid, start[, its job]}: the worker that follows the trial (study.workers)
HEARTBEAT_ATTR = PREFIX + "heartbeat"  # when that worker last said it is alive (time.time())

# --- a study's system attributes ---
SPEC_ATTR = PREFIX + "spec"  # the study file's definition as created
STUDY_DIR_ATTR = PREFIX + "study_dir"  # where the trials' run folders live
CONFIRMATION_ATTR = PREFIX + "confirmation"  # written by `abtune study confirm`, one record per trial
# The study's answer (study/recommendation.py): trial, rule, margin, evidence, the DDP figure it was held
# against; a user attribute, so optuna-dashboard and a user's own Optuna code read it too
RECOMMENDATION_ATTR = PREFIX + "recommendation"
RECOMMENDATION_TEXT_TAG = RECOMMENDATION_ATTR + ".text"  # MLflow: the study's answer, part of its run's description
ARTIFACTS_AT_ATTR = PREFIX + "study_artifacts_at"  # when a runner last rebuilt the study's plots (time.time())
ARTIFACTS_COST_ATTR = PREFIX + "study_artifacts_cost_s"  # how long that rebuild took (wall seconds)
# {inputs, analysis}: the latest importances and inert parameters a runner computed (study/importance.py), and a
# digest of the trials they were computed from; `study best` prints them while the trials are the same
ANALYSIS_ATTR = PREFIX + "importance_analysis"
STOP_ATTR = PREFIX + "stop"  # {id, mode, at}: the latest `abtune study stop`
# {inputs, flops, params, seconds_per_sample}: the cost probe of the trial's model on a host (study/cost.py);
# `study run` on the same host with the same model reads it instead of importing torch to probe again
LOCAL_PROBE_ATTR = PREFIX + "local_probe"
WORKER_JOBS_ATTR = PREFIX + "worker_jobs"  # the job ids of the workers `abtune study launch` submitted
WORKER_KIND_ATTR = PREFIX + "worker_job_kind"  # the launcher kind of those jobs

# --- what earlier versions wrote --------------------------------------------------------------------
LEGACY_NAMES = {name: name.replace(PREFIX, "abtune:", 1) for name in (
    WORKER_ATTR, HEARTBEAT_ATTR, ARTIFACTS_AT_ATTR, ARTIFACTS_COST_ATTR, STOP_ATTR, WORKER_JOBS_ATTR, WORKER_KIND_ATTR)}


def stored(attrs: Mapping[str, Any], name: str, default: Any = None) -> Any:
    """`attrs[name]`, else what an earlier version stored under its other spelling, else `default`."""
    if name in attrs:
        return attrs[name]
    return attrs.get(LEGACY_NAMES.get(name, name), default)
