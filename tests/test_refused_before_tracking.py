"""`abtune train` into a folder that already holds a run refuses in one line before it opens the tracking store
(MLflow's import and its database: seconds of CPU for a refusal)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import abtune.tracking
from tests.conftest import CliResult


def test_an_existing_run_is_refused_before_the_tracking_store_opens(
        tmp_path: Path, tiny_config: Path, abtune_main: Callable[..., CliResult], monkeypatch: pytest.MonkeyPatch) -> None:
    def opened(*args: object, **kwargs: object) -> None:
        raise AssertionError("the tracking store was opened")

    monkeypatch.setattr(abtune.tracking, "open_tracking", opened)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("name: earlier\n")
    result = abtune_main("train", str(tiny_config), "--run-dir", str(run_dir))
    assert (result.returncode, result.stderr) == (
        2, f"abtune: error: {run_dir} already holds a run; pass --resume to continue it or choose another --run-dir\n")
    assert (run_dir / "config.yaml").read_text() == "name: earlier\n"
