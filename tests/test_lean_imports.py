"""What a rank pays at start-up: the warm server (abtune/launch/warm.py) imports MLflow only where its ranks
track, and a rank's own modules import neither scikit-learn nor MLflow."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from abtune.launch import warm
from abtune.tracking.uri import URI_VARIABLE

STORE = "mlflow.store.tracking.sqlalchemy_store"


@pytest.mark.parametrize(("uri", "tracking", "store"), [
    (None, False, False),
    ("sqlite:////tmp/mlflow.db", True, True),
    ("postgresql+psycopg2://abtune@db/mlflow", True, True),
    ("http://127.0.0.1:5000", True, False),
], ids=["untracked", "sqlite", "postgresql", "server"])
def test_the_server_preloads_mlflow_and_its_sql_store_only_for_ranks_that_use_them(
        uri: str | None, tracking: bool, store: bool) -> None:
    env = {"PATH": "/usr/bin", **({URI_VARIABLE: uri} if uri else {})}
    modules = warm.preloaded_modules(env)
    assert set(warm.PRELOAD) <= set(modules)
    assert ("mlflow" in modules) is tracking
    assert (STORE in modules) is store


PRELOAD_AND_REPORT = """
import json, os, sys
from abtune.launch import warm
report = {"untracked": [warm._preload(), sorted(m for m in NAMES if m in sys.modules)]}
os.environ[URI] = "sqlite:////tmp/abtune-lean-imports.db"
report["tracked"] = [warm._preload(), sorted(m for m in NAMES if m in sys.modules)]
print(json.dumps(report))
"""


@pytest.mark.slow  # a Python that imports torch and MLflow: seconds of CPU
def test_an_untracked_server_imports_no_mlflow_and_a_tracked_one_stays_forkable() -> None:
    """The server as warm.py starts it: every rank's modules (the trainer, the data sets, each method), then,
    once a tracking URI is set, MLflow's SQL store. Neither scikit-learn (the digits are read from its file)
    nor MLflow is a rank's import; and with the store loaded the server still runs one thread, so it forks."""
    names = ["sklearn", "mlflow", "sqlalchemy", STORE, "abtune.training.trainer", "abtune.data"]
    code = f"NAMES = {names!r}; URI = {URI_VARIABLE!r}\n" + PRELOAD_AND_REPORT
    env = {key: value for key, value in os.environ.items() if key != URI_VARIABLE}
    result = subprocess.run([sys.executable, "-c", code], env={**env, **warm.SERVER_ENVIRONMENT},
                            capture_output=True, text=True, check=True)
    report = json.loads(result.stdout)
    assert report["untracked"] == [None, ["abtune.data", "abtune.training.trainer"]]
    assert report["tracked"] == [None, sorted(["abtune.data", "abtune.training.trainer", "mlflow", "sqlalchemy",
                                               STORE])]
