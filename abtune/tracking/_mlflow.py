"""MLflow as the record of every run: created by the orchestrator, filled by rank 0, finished here.

Layout: one experiment per study (or per run config name for `abtune train`); a study has one
parent run and one child run per trial (`mlflow.parentRunId`, tags `optuna.study` and
`optuna.trial_number`).
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import abtune
from abtune.attrs import RECOMMENDATION_TEXT_TAG
from abtune.config import RunConfig, flatten, load_run_config
from abtune.errors import AbtuneError, ConfigError
from abtune.redact import redact
from abtune.runfiles import CONFIG_FILE, METRICS_FILE, SUMMARY_FILE, RunSummary, find_summary
from abtune.tracking._base import RECOMMENDED_TAG, LaunchInfo, Tracking
from abtune.tracking.records import Point, final_points, predicted_tags, records_points, run_description
from abtune.tracking.store import check_database, refused_revision
from abtune.tracking.uri import export_tracking_uri, local_artifact_root, quiet_secrets_in_mlflow_logs
from abtune.tracking.view import experiment_tags
from abtune.training.hooks import read_metrics

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

PARAMS_PER_BATCH = 100  # MLflow's limit per log_batch
METRICS_PER_BATCH = 1000
# An orchestrator may wait a little for a flaky server, not MLflow's default of minutes.
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                 "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}
# A SQL store's pool keeps one idle connection, not SQLAlchemy's five: every study worker and trial rank
# holds its own, and MLflow's start-up alone left two open (the schema check): a large share of a shared
# PostgreSQL's connections once a study has many workers. Concurrent users still get overflow ones.
SQL_POOL_DEFAULTS = {"MLFLOW_SQLALCHEMYSTORE_POOL_SIZE": "1"}
NOTE_TAG = "mlflow.note.content"  # the run's description, shown at the top of its page
STUDY_TEXT_TAG = "abtune.study.description"  # the study's own description; NOTE_TAG adds its plots under it
# The study plots the parent run's page shows under its description, in this order (study_plots.py's names).
OVERVIEW_PLOTS = ("pareto_front", "optimization_history", "evaluations", "importances")


class TrackingUnavailable(AbtuneError):
    """The tracking store cannot be reached or refused a request when a run starts."""


@contextlib.contextmanager
def _sqlite_setup_lock(uri: str) -> Iterator[None]:
    """An exclusive lock on DB.lock beside a SQLite store; nothing for other stores. Opening a new store
    creates its tables, and processes opening it together (study workers started at once) must take
    turns, or all but one fail with "table ... already exists"."""
    if not uri.startswith("sqlite:///") or uri.endswith(":memory:"):
        yield
        return
    import fcntl

    lock = Path(uri.removeprefix("sqlite:///") + ".lock")
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        handle = lock.open("a")
    except OSError as error:
        raise ConfigError(f"MLflow store {lock.parent}: cannot write {lock} ({(error.strerror or str(error)).lower()}); "
                          "run from a folder you can write, or pass --tracking-uri or --no-tracking") from None
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


class MlflowTracking(Tracking):
    def __init__(self, uri: str) -> None:
        import os

        for name, value in {**HTTP_DEFAULTS, **SQL_POOL_DEFAULTS}.items():
            os.environ.setdefault(name, value)
        self.uri = export_tracking_uri(uri)  # the ranks inherit it (and any credentials) from here
        from mlflow import MlflowClient

        quiet_secrets_in_mlflow_logs()
        self.outage: str | None = None  # the store's first failure once work started (`_lost`)
        try:
            check_database(self.uri)
            with _sqlite_setup_lock(self.uri):  # the client creates a new SQLite store's tables
                self.client = MlflowClient(self.uri)
        except AbtuneError:  # abtune's own one line (a folder it cannot write, another program's database)
            raise
        except Exception as error:
            raise self._cannot_open(error) from None

    def describe(self) -> str:
        return redact(self.uri)

    def check(self) -> MlflowTracking:
        """Fail before anything starts when the store cannot be reached."""
        try:
            self.client.search_experiments(max_results=1)
        except Exception as error:
            raise self._cannot_open(error) from None
        return self

    def _cannot_open(self, error: Exception) -> AbtuneError:
        refused = refused_revision(self.uri, str(error))
        if refused is not None:
            return refused
        return TrackingUnavailable(f"cannot reach MLflow at {self.describe()}: {_first_line(error)}; start or "
                                   "fix the tracking server (--tracking-uri), or pass --no-tracking")

    def _lost(self, error: BaseException) -> None:
        """A store that fails once work has started costs records, never the work, and is reported once per
        process however many calls fail: every number is in the runs' folders (metrics.jsonl, summary.json)."""
        if self.outage is not None:
            return
        self.outage = _first_line(error)
        _warn(f"MLflow at {self.describe()} failed ({self.outage}); training goes on, every run keeps its "
              "metrics in its folder (metrics.jsonl, summary.json) and MLflow may lack some; later tracking "
              "failures are not reported")

    # --- runs -----------------------------------------------------------------------------
    def start_run(self, config: RunConfig, *, experiment: str, run_name: str, parent_run_id: str | None = None,
                  tags: dict[str, Any] | None = None, launch_info: LaunchInfo | None = None,
                  required: bool = True, params: dict[str, Any] | None = None) -> str | None:
        launch = launch_info or LaunchInfo()
        all_tags = {"abtune.role": "trial" if parent_run_id else "run", "abtune.launcher": launch.launcher,
                    **({"mlflow.parentRunId": parent_run_id} if parent_run_id else {}), **(tags or {})}
        try:
            experiment_id = self._experiment_id(experiment)
            run = self.client.create_run(experiment_id, run_name=run_name,
                                         tags={k: redact(str(v)) for k, v in all_tags.items()})
            self._log_params(run.info.run_id, {**run_params(config, launch), **(params or {})})
        except AbtuneError:
            raise
        except Exception as error:
            if not required:
                self._lost(error)
                return None
            raise TrackingUnavailable(f"MLflow at {self.describe()} refused the run: {_first_line(error)}; "
                                      "start or fix the tracking server, or pass --no-tracking") from None
        return str(run.info.run_id)

    def hook_spec(self, run_id: str | None) -> dict[str, Any] | None:
        return None if run_id is None else {"factory": self.HOOK_FACTORY, "options": {"run_id": run_id}, "may_stop": False}

    def finish_run(self, run_id: str | None, run_dir: Path | None, status: str = "FINISHED") -> str:
        if run_id is None:
            return "off"
        try:
            replayed = self._replay(run_id, run_dir) if run_dir is not None else 0
            if run_dir is not None:
                self._log_artifacts(run_id, run_dir)
            state = "replayed" if replayed else "complete"
            self.client.set_tag(run_id, "abtune.logging", state)
            summary = find_summary(run_dir) if run_dir is not None else None
            self._tag_early_stop(run_id, summary)
            self._tag_prediction(run_id, summary)
            self._describe(run_id, summary)
            self.client.set_terminated(run_id, status)
            return state
        except Exception as error:
            if self.outage is None:
                kept = f"; every metric is kept in {run_dir}/{METRICS_FILE} and {SUMMARY_FILE}" if run_dir else ""
                _warn(f"MLflow run {run_id} at {self.describe()} is incompletely logged ({_first_line(error)}){kept}")
            self._lost(error)
            _try(lambda: self.client.set_tag(run_id, "abtune.logging", "incomplete"))
            _try(lambda: self.client.set_terminated(run_id, status))
            return "incomplete"

    def _tag_early_stop(self, run_id: str, summary: RunSummary | None) -> None:
        """A run a pruner (or a stop request) ended early says so, where the UI can filter on it:
        tags.abtune.stopped_early = 'pruned'."""
        if summary is not None and summary.stopped_early:
            self.client.set_tag(run_id, "abtune.stopped_early", summary.stopped_early)
            self.client.set_tag(run_id, "abtune.stopped_at_step", str(summary.steps_done))

    def _tag_prediction(self, run_id: str, summary: RunSummary | None) -> None:
        """With train.cluster: where the predicted figures' compute comes from (measured, published, scaled or
        assumed), where the UI can filter on it."""
        for key, value in predicted_tags(summary.raw.get("predicted") if summary else None).items():
            self.client.set_tag(run_id, key, value)

    def _describe(self, run_id: str, summary: RunSummary | None) -> None:
        """The result in one line at the top of the run's page (its description), unless it has one."""
        run = self.client.get_run(run_id)
        if summary is None or NOTE_TAG in run.data.tags:
            return
        study = run.data.tags.get("optuna.study")
        what = f"{run.info.run_name}" + (f" of study {study}" if study else "")
        self.client.set_tag(run_id, NOTE_TAG, run_description(summary.raw, what))

    def log_metrics(self, run_id: str | None, metrics: dict[str, float]) -> None:
        if run_id is None or not metrics:
            return
        try:
            self._log_points(run_id, [Point(key, value, 0) for key, value in metrics.items()])
        except Exception as error:  # the values are in the study's storage; the record is a convenience
            self._lost(error)

    def _experiment_id(self, name: str) -> str:
        from mlflow.exceptions import MlflowException

        found = self.client.get_experiment_by_name(name)
        if found is None:
            root = local_artifact_root(self.uri)
            location = (root / re.sub(r"[^A-Za-z0-9_.-]", "_", name)).as_uri() if root else None
            try:
                return str(self.client.create_experiment(name, artifact_location=location, tags=experiment_tags()))
            except MlflowException:  # created meanwhile by another process
                found = self.client.get_experiment_by_name(name)
                if found is None:
                    raise
        if found.lifecycle_stage == "deleted":
            raise AbtuneError(f"MLflow experiment {name!r} is deleted; restore it (mlflow experiments restore "
                              f"--experiment-id {found.experiment_id}) or use another name")
        for key, value in experiment_tags().items():  # an experiment from before abtune set them
            if key not in found.tags:
                self.client.set_experiment_tag(found.experiment_id, key, value)
        return str(found.experiment_id)

    def _log_params(self, run_id: str, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, redact(str(v))) for k, v in params.items()]
        for start in range(0, len(items), PARAMS_PER_BATCH):
            self.client.log_batch(run_id, params=items[start:start + PARAMS_PER_BATCH])

    # --- the end of a run -------------------------------------------------------------------
    def _replay(self, run_id: str, run_dir: Path) -> int:
        """Log every point of metrics.jsonl and summary.json that the store does not hold yet;
        return how many of the step points (the hook's share) were missing."""
        missing = self._missing(run_id, records_points(read_metrics(run_dir)))
        summary = find_summary(run_dir)
        final = self._missing(run_id, final_points(summary.raw, self._wall_seconds(run_id))) if summary else []
        self._log_points(run_id, missing + final)
        return len(missing)

    def _missing(self, run_id: str, points: list[Point]) -> list[Point]:
        held = {key: {m.step for m in self.client.get_metric_history(run_id, key)} for key in {p.key for p in points}}
        return [p for p in points if p.step not in held[p.key]]

    def _log_points(self, run_id: str, points: list[Point]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        for start in range(0, len(points), METRICS_PER_BATCH):
            batch = points[start:start + METRICS_PER_BATCH]
            self.client.log_batch(run_id, metrics=[Metric(p.key, p.value, now, p.step) for p in batch])

    def _wall_seconds(self, run_id: str) -> float:
        return time.time() - self.client.get_run(run_id).info.start_time / 1000

    def _log_artifacts(self, run_id: str, run_dir: Path) -> None:
        with tempfile.TemporaryDirectory(prefix="abtune-artifacts-") as folder:
            staging = Path(folder)
            for name in (CONFIG_FILE, SUMMARY_FILE, METRICS_FILE):
                if (run_dir / name).exists():
                    (staging / name).write_text(redact((run_dir / name).read_text()))
            (staging / "plots").mkdir()
            _write_run_plots(run_dir, staging / "plots", self.client.get_run(run_id).info.run_name or "")
            self.client.log_artifacts(run_id, str(staging))

    # --- studies ----------------------------------------------------------------------------
    def study_parent_run(self, study_name: str, storage: str) -> str | None:
        """The study's parent run in the experiment named after it: found again when a study resumes; None
        when the store fails (the study runs untracked)."""
        try:
            return self._study_parent_run(study_name, storage)
        except AbtuneError:
            raise
        except Exception as error:
            self._lost(error)
            return None

    def _study_parent_run(self, study_name: str, storage: str) -> str:
        experiment_id = self._experiment_id(study_name)
        query = f"tags.`abtune.role` = 'study' and tags.`optuna.study` = '{study_name}'"
        found = self.client.search_runs([experiment_id], filter_string=query, max_results=1)
        if found:
            return str(found[0].info.run_id)
        tags = {"abtune.role": "study", "optuna.study": study_name, "optuna.storage": redact(storage)}
        return str(self.client.create_run(experiment_id, run_name=f"{study_name}-study", tags=tags).info.run_id)

    def close_study_parent_run(self, study_name: str, status: str) -> None:
        try:
            experiment = self.client.get_experiment_by_name(study_name)
            if experiment is None:
                return
            query = (f"tags.`abtune.role` = 'study' and tags.`optuna.study` = '{study_name}' "
                     "and attributes.status = 'RUNNING'")
            for run in self.client.search_runs([experiment.experiment_id], filter_string=query):
                self.client.set_terminated(run.info.run_id, status)
        except Exception as error:  # the study's own state is in its storage
            self._lost(error)

    def log_report(self, experiment: str, run_name: str, files: list[Path], tags: dict[str, str]) -> str | None:
        try:
            run_id = self.start_group(experiment, run_name, {"abtune.role": "report", **tags})
        except TrackingUnavailable as error:  # the files are on disk; the record is a convenience
            _warn(f"could not log the report: {error}")
            return None
        self.finish_group(run_id, files, "FINISHED", folder="report")
        return run_id

    def start_group(self, experiment: str, run_name: str, tags: dict[str, str]) -> str:
        try:
            return str(self.client.create_run(self._experiment_id(experiment), run_name=run_name,
                                              tags={k: redact(v) for k, v in tags.items()}).info.run_id)
        except AbtuneError:
            raise
        except Exception as error:
            raise TrackingUnavailable(f"MLflow at {self.describe()} refused the run: {_first_line(error)}; "
                                      "start or fix the tracking server, or pass --no-tracking") from None

    def finish_group(self, run_id: str | None, files: list[Path], status: str = "FINISHED", folder: str | None = None) -> None:
        if run_id is None:
            return
        try:
            for path in files:
                self.client.log_artifact(run_id, str(path), folder)
            self.client.set_terminated(run_id, status)
        except Exception as error:  # the files are on disk; the record is a convenience
            if self.outage is None:
                _warn(f"MLflow run {run_id} at {self.describe()} is incompletely logged ({_first_line(error)}); "
                      f"the files are in {files[0].parent if files else 'their folder'}")
            self._lost(error)
            _try(lambda: self.client.set_terminated(run_id, status))

    def describe_study(self, parent_run_id: str | None, description: str, params: dict[str, Any],
                       progress: dict[str, float], step: int = 0) -> None:
        if parent_run_id is None:
            return
        try:
            held = self.client.get_run(parent_run_id).data
            self._log_params(parent_run_id, {k: v for k, v in params.items() if k not in held.params and v is not None})
            self._log_points(parent_run_id, [Point(key, value, step) for key, value in progress.items()])
            self.client.set_tag(parent_run_id, STUDY_TEXT_TAG, description)
            self.client.set_tag(parent_run_id, NOTE_TAG, study_note(parent_run_id, {**held.tags, STUDY_TEXT_TAG: description}))
        except Exception as error:  # the study's own storage holds all of it; the record is a convenience
            self._lost(error)

    def update_study_artifacts(self, parent_run_id: str | None, trials: Sequence[FrozenTrial],
                               objectives: Sequence[str] | None, analysis: dict[str, Any] | None = None,
                               recommended: int | None = None) -> None:
        """Pareto front, importances and optimization history of a study's `trials` (every one, the reference
        trials included) as PNGs on the parent run, with the tags by which its description (written next by
        describe_study or show_recommendation) shows them, and `analysis` (importances per objective, inert
        parameters) as importances.json; `recommended` ringed on the front."""
        if parent_run_id is None:
            return
        from abtune.tracking.study_plots import write_study_plots

        try:
            with tempfile.TemporaryDirectory(prefix="abtune-study-") as folder:
                written = write_study_plots(trials, objectives, Path(folder), analysis, recommended)
                self.client.log_artifacts(parent_run_id, folder, "study")
                self.client.log_batch(parent_run_id, tags=_study_tags(written))
        except Exception as error:  # a dashboard must not stop a study
            self._lost(error)

    def show_recommendation(self, parent_run_id: str | None, tags: dict[str, str], metrics: dict[str, float],
                            recommended_run: str | None, step: int = 0) -> None:
        if parent_run_id is None:
            return
        from mlflow.entities import RunTag

        try:
            self._log_points(parent_run_id, [Point(key, value, step) for key, value in metrics.items()])
            self.client.log_batch(parent_run_id, tags=[RunTag(k, redact(v)) for k, v in tags.items()])
            held = self.client.get_run(parent_run_id).data.tags
            self.client.set_tag(parent_run_id, NOTE_TAG, study_note(parent_run_id, held))
            self._tag_recommended_run(parent_run_id, recommended_run)
        except Exception as error:  # the study's storage holds the same; the record is a convenience
            self._lost(error)

    def _tag_recommended_run(self, parent_run_id: str, chosen: str | None) -> None:
        """`abtune.recommended = true` on the recommended trial's run only (an earlier choice loses it)."""
        experiment_id = self.client.get_run(parent_run_id).info.experiment_id
        earlier = self.client.search_runs([experiment_id], filter_string=f"tags.`{RECOMMENDED_TAG}` = 'true'")
        for run in earlier:
            if run.info.run_id != chosen:
                self.client.delete_tag(run.info.run_id, RECOMMENDED_TAG)
        if chosen is not None:
            self.client.set_tag(chosen, RECOMMENDED_TAG, "true")


def study_note(run_id: str, tags: dict[str, str]) -> str:
    """The parent run's description: the study's first line (its question), its recommendation, the rest of its
    text, then each study plot written so far, shown from the run's artifacts (the URL the MLflow UI itself
    reads artifacts from, relative to its page). The answer comes second: MLflow folds a long description
    after a few lines ("Show more")."""
    images = [f"![{name}](get-artifact?path={quote(f'study/{name}.png', safe='')}&run_uuid={run_id})"
              for name in OVERVIEW_PLOTS if tags.get(f"abtune.plot.{name}") == "written"]
    recommended = [tags[RECOMMENDATION_TEXT_TAG]] if RECOMMENDATION_TEXT_TAG in tags else []
    question, _, rest = tags.get(STUDY_TEXT_TAG, f"**{tags.get('optuna.study', 'study')}**").partition("\n\n")
    return "\n\n".join([question, *recommended, *([rest] if rest else []), *images])


def run_params(config: RunConfig, launch: LaunchInfo) -> dict[str, Any]:
    """The fully resolved config (flattened), what the method derives from it (AB: its schedule in steps)
    and where the run ran."""
    params: dict[str, Any] = flatten(config)
    params.update(method=config.method.name, world_size=launch.world_size, nodes=launch.nodes,
                  ranks_per_node=launch.ranks_per_node, launcher=launch.launcher, git_commit=git_commit(),
                  abtune_version=abtune.__version__)
    params.update(config.method.derived_params(config.train.steps, launch.ranks_per_node))
    return params


def git_commit() -> str:
    """The commit of the abtune code that ran, `-dirty` when it has uncommitted changes."""
    folder = Path(abtune.__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(folder), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}-dirty" if dirty else head


def _write_run_plots(run_dir: Path, folder: Path, run: str) -> None:
    """The run's plots, each titled with `run` (its MLflow name: `trial-7 · DDP reference`)."""
    from abtune.tracking import plots

    summary = find_summary(run_dir)
    config = load_run_config(run_dir / CONFIG_FILE)
    records = read_metrics(run_dir)
    if records:
        plots.accuracy_and_loss(records, phase_segments(config, summary), folder / "accuracy_loss.png", run)
    if summary is not None:
        plots.traffic_per_phase(summary.raw, folder / "traffic_per_phase.png", run)
        plots.spectra(summary.raw, config.method.spectrum_cutoff(), folder / "spectra.png", run)


def phase_segments(config: RunConfig, summary: RunSummary | None) -> list[tuple[str, int, int]]:
    done = summary.steps_done if summary else config.train.steps
    schedule = config.method.phase_schedule(config.train.steps)
    if schedule is None:
        return [("train", 0, done)]
    return [(s.phase.value, s.start, min(s.end, done)) for s in schedule.segments if s.start < done]


def _study_tags(written: dict[str, str]) -> list[Any]:
    from mlflow.entities import RunTag

    return [RunTag(f"abtune.plot.{name}", state) for name, state in written.items()]


def _try(call: Any) -> None:
    try:
        call()
    except Exception:  # noqa: BLE001 - best effort while the store is down; the warning was given
        return


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return redact(f"{type(error).__name__}: {text.splitlines()[0] if text else ''}")[:300]


def _warn(message: str) -> None:
    print(f"abtune: warning: {redact(message)}", file=sys.stderr, flush=True)


__all__ = ["MlflowTracking", "TrackingUnavailable", "git_commit", "run_params", "phase_segments"]
