"""Opening a study's SQL storage checks its schema against the installed Optuna's as Optuna does, but reads
Optuna's migration scripts for the newest revision once per process (at every open it cost a third of a
second of CPU, and a study runner or a command opens the storage several times)."""

from __future__ import annotations

from pathlib import Path

import pytest
from optuna.storages._rdb.storage import _VersionManager

from abtune.errors import ConfigError
from abtune.study import storage as storage_module
from abtune.study.storage import open_storage


def test_the_newest_revision_is_read_once_for_every_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage_module, "_SCHEMA_HEAD", [], raising=False)  # as in a new process
    reads = []
    read = _VersionManager.get_head_version
    monkeypatch.setattr(_VersionManager, "get_head_version", lambda self: reads.append(1) or read(self))
    url = f"sqlite:///{tmp_path / 'o.db'}"
    open_storage(url, create=True)  # a new file: Optuna stamps it with the newest revision
    for _ in range(3):
        assert open_storage(url).get_all_studies() == []
    assert len(reads) <= 2


def test_a_storage_of_an_older_schema_is_refused_with_optunas_advice(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    storage = open_storage(url, create=True)
    with storage.engine.begin() as connection:  # as an older Optuna left it
        connection.exec_driver_sql("UPDATE alembic_version SET version_num = 'v3.0.0.d'")
    storage.engine.dispose()
    with pytest.raises(ConfigError, match="is no longer compatible with the table schema.*optuna storage upgrade"):
        open_storage(url)
