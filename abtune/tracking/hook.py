"""Rank 0's MLflow hook: step metrics sent in batches by a background thread, plus system metrics.

The training loop only appends to a list. Every `flush_seconds` the sender ships what is pending in
one `log_batch`; if the store is unreachable the batch stays pending and is retried at the next
flush (one warning, no exception reaches training). Whatever is still pending when the run ends is
in metrics.jsonl anyway, and the orchestrator's `finish_run` replays it.

The tracking URI comes from the environment (MLFLOW_TRACKING_URI, credentials in MLflow's
username/password variables), never from hooks.yaml.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from abtune import jobenv
from abtune.redact import redact
from abtune.tracking.records import MetricStream, Point
from abtune.tracking.uri import URI_VARIABLE, quiet_secrets_in_mlflow_logs
from abtune.training.hooks import TrainingHook

BATCH_LIMIT = 1000  # MLflow's maximum metrics per log_batch
CLOSE_TIMEOUT_S = 30.0
# Retrying is the sender's job (at the next flush); a blocked request would only delay it.
HTTP_SETTINGS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


def make_hook(run_dir: Path, run_id: str, flush_seconds: float = 2.0,
              system_metrics_seconds: float = 10.0) -> TrainingHook:
    """The factory named in hooks.yaml (see `abtune.tracking.MlflowTracking.hook_spec`)."""
    uri = os.environ.get(URI_VARIABLE)
    if not uri:
        _warn(f"{URI_VARIABLE} is not set on rank 0; MLflow metrics are replayed from metrics.jsonl at the end")
        return TrainingHook()
    try:
        return MlflowHook(uri, run_id, flush_seconds, system_metrics_seconds)
    except Exception as error:  # a store that fails as the run starts (a deleted SQLite file) must not stop it
        _warn(f"MLflow is unreachable ({type(error).__name__}: {_first_line(error)}); metrics stay in "
              "metrics.jsonl and are replayed at the end of the run")
        return TrainingHook()


class MlflowHook(TrainingHook):
    def __init__(self, uri: str, run_id: str, flush_seconds: float, system_metrics_seconds: float) -> None:
        os.environ.update(HTTP_SETTINGS)
        from mlflow import MlflowClient  # imported on rank 0 only, when tracking is on

        quiet_secrets_in_mlflow_logs()
        # Start/stop and connection-pool notes, a traceback for every failing SQL request, a note when the
        # store fails: the sender's one warning says it.
        for chatty in ("mlflow.system_metrics", "mlflow.store.db.utils"):
            logging.getLogger(chatty).setLevel(logging.CRITICAL)
        self.stream = MetricStream()
        self.sender = _Sender(MlflowClient(uri), run_id, flush_seconds)
        self.sender.describe_rank0()
        self.monitor = _system_metrics(uri, run_id, system_metrics_seconds)

    def on_log(self, record: dict[str, Any]) -> None:
        self.sender.put(self.stream.log_points(record))

    def on_evaluation(self, row: dict[str, Any]) -> str | None:
        self.sender.put(self.stream.evaluation_points(row))
        return None

    def close(self) -> None:
        if self.monitor is not None:
            with contextlib.suppress(Exception):  # the store is down: the sender warned
                self.monitor.finish()
        self.sender.close()


class _Sender:
    """Pending points, shipped by one daemon thread; a failed batch stays pending."""

    def __init__(self, client: Any, run_id: str, flush_seconds: float) -> None:
        self.client, self.run_id, self.flush_seconds = client, run_id, flush_seconds
        self.pending: list[Point] = []
        self.lock = threading.Lock()
        self.closing = threading.Event()
        self.warned = False
        self.thread = threading.Thread(target=self._run, name="abtune-mlflow", daemon=True)
        self.thread.start()

    def describe_rank0(self) -> None:
        """Where rank 0 ran: the node as a tag, its scheduler's job as a param (`KIND_job_id`) when there is one."""
        from mlflow.entities import Param, RunTag

        job = jobenv.job_param()
        params = [Param(*job)] if job is not None else []
        self._send(lambda: self.client.log_batch(self.run_id, params=params,
                                                 tags=[RunTag("abtune.node", socket.gethostname())]))

    def put(self, points: list[Point]) -> None:
        with self.lock:
            self.pending.extend(points)

    def _run(self) -> None:
        while not self.closing.wait(self.flush_seconds):
            self.flush()
        self.flush()

    def flush(self) -> bool:
        from mlflow.entities import Metric

        with self.lock:
            batch, self.pending = self.pending, []
        now = int(time.time() * 1000)
        for start in range(0, len(batch), BATCH_LIMIT):
            metrics = [Metric(p.key, p.value, now, p.step) for p in batch[start:start + BATCH_LIMIT]]
            if not self._send(lambda m=metrics: self.client.log_batch(self.run_id, metrics=m)):
                with self.lock:
                    self.pending = batch[start:] + self.pending
                return False
        return True

    def _send(self, call: Any) -> bool:
        try:
            call()
        except Exception as error:  # an outage must never reach the training loop
            if not self.warned:
                self.warned = True
                _warn(f"MLflow is unreachable ({type(error).__name__}: {_first_line(error)}); metrics stay in "
                      "metrics.jsonl and are sent when it is back or replayed at the end of the run")
            return False
        return True

    def close(self) -> None:
        self.closing.set()
        self.thread.join(CLOSE_TIMEOUT_S)


def _system_metrics(uri: str, run_id: str, seconds: float) -> Any:
    """MLflow's CPU/memory/disk/network (and GPU) sampler, on this run, with the node as id."""
    try:
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        monitor = SystemMetricsMonitor(run_id, sampling_interval=seconds, node_id=socket.gethostname(),
                                       tracking_uri=uri)
        monitor.start()
    except Exception as error:  # psutil missing, store down: training goes on without them
        _warn(f"no system metrics: {type(error).__name__}: {_first_line(error)}")
        return None
    return monitor


def _first_line(error: BaseException) -> str:
    return redact(str(error).strip().splitlines()[0] if str(error).strip() else "")[:300]


def _warn(message: str) -> None:
    print(f"abtune: warning: {redact(message)}", file=sys.stderr, flush=True)
