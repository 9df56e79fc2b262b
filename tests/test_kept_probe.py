"""The cost probe a study keeps: `study create` times the trial's model here and stores what it measured;
`study run` on the same host reads it (no second probe, no torch imported by the runner); on another host it
probes again."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from abtune.attrs import LOCAL_PROBE_ATTR
from abtune.study import cost
from abtune.study.storage import open_storage
from tests.conftest import CliResult, with_checkout_on_path
from tests.study_helpers import write_study

PROBED = 0.01  # seconds a sample the stubbed probe "measured" (the real probe: tests/test_cost_before_start.py)


def _estimate(output: str) -> str:
    return next(line for line in output.splitlines() if line.startswith("estimated training time here"))


def test_a_run_on_the_host_that_probed_reads_the_kept_probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str],
                                                            abtune_main: Callable[..., CliResult]) -> None:
    probes: list[tuple[object, ...]] = []
    monkeypatch.setattr(cost, "probe_seconds_per_sample", lambda *args: probes.append(args) or PROBED)
    url = f"sqlite:///{tmp_path}/optuna.db"
    created = abtune_main("study", "create", str(write_study(tmp_path / "s.yaml", trials=3)), "--storage", url,
                          cwd=tmp_path)
    assert created.returncode == 0 and len(probes) == 1, created.stderr
    storage = open_storage(url)
    study_id = storage.get_study_id_from_name("tiny")
    kept = storage.get_study_system_attrs(study_id)[LOCAL_PROBE_ATTR]
    assert kept["seconds_per_sample"] == PROBED and kept["inputs"]["host"] == cost.socket.gethostname()
    assert kept["inputs"]["batch"] == cost.PROBE_BATCH and kept["flops"] > 0 and kept["params"] > 0

    spec = cost.stored_spec_of(storage, "tiny")
    cost.check_local_run(spec, "tiny", "local", None, 1, yes=False, kept=cost.KeptProbe(storage, study_id))
    assert len(probes) == 1  # read, not probed again
    assert _estimate(capsys.readouterr().out) == _estimate(created.stdout)

    monkeypatch.setattr(cost.socket, "gethostname", lambda: "another-host")
    cost.check_local_run(spec, "tiny", "local", None, 1, yes=False, kept=cost.KeptProbe(storage, study_id))
    assert len(probes) == 2  # another machine: probed there, and kept for the runs that follow on it
    assert storage.get_study_system_attrs(study_id)[LOCAL_PROBE_ATTR]["inputs"]["host"] == "another-host"


def test_the_cost_module_imports_no_torch() -> None:
    """What lets a runner that reads the kept probe start without torch (seconds of CPU for each `study run`)."""
    found = subprocess.run([sys.executable, "-c", "import sys, abtune.study.cost; print(sorted({'torch', "
                            "'torchvision'} & set(sys.modules)))"], capture_output=True, text=True, check=True,
                           env=with_checkout_on_path(os.environ)).stdout
    assert found.strip() == "[]"
