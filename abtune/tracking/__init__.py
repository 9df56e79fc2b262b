"""MLflow tracking: the record of every run and study, and the dashboards that show it.

The orchestrating process (`abtune train`, the study runner) holds a `Tracking`::

    tracking = open_tracking(uri)                      # None: --tracking-uri > MLFLOW_TRACKING_URI > ./mlflow.db
    run_id = tracking.start_run(config, experiment=..., run_name=..., launch_info=LaunchInfo(...))
    write_hook_specs(run_dir, [tracking.hook_spec(run_id), ...])   # rank 0 logs step metrics
    ... launch the ranks ...
    tracking.finish_run(run_id, run_dir, "FINISHED")   # replay gaps, results, artifacts, plots

A study: `parent = tracking.study_parent_run(study_name, storage)`, per trial
`tracking.start_trial_run(config, trial, study_name=..., parent_run_id=parent, launch_info=...)`, then
hook_spec / finish_run as above and `tracking.update_study_artifacts(parent, trials, objectives)` as trials end.

`open_tracking(enabled=False)` returns the do-nothing base. mlflow is imported only when used.
"""

from __future__ import annotations

from abtune.tracking._base import LaunchInfo, Tracking
from abtune.tracking.uri import resolve_tracking_uri


def open_tracking(uri: str | None = None, enabled: bool = True) -> Tracking:
    if not enabled:
        return Tracking()
    from abtune.tracking._mlflow import MlflowTracking

    _quiet_store_setup()
    return MlflowTracking(resolve_tracking_uri(uri)).check()


def _quiet_store_setup() -> None:
    """A new SQLite store announces its schema migrations on stderr; abtune's own output says enough. MLflow
    also logs every SQL error of its store with a traceback before raising it: abtune words each itself."""
    import logging

    logging.getLogger("alembic").setLevel(logging.WARNING)
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)


__all__ = ["LaunchInfo", "Tracking", "open_tracking", "resolve_tracking_uri"]
