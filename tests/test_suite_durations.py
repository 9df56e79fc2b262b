"""benchmarks/suite_durations.py: pytest's --durations report summed per file and phase."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from tests.conftest import REPO

REPORT = """\
============================= slowest durations ==============================
30.50s setup    tests/slurm/test_study_slurm.py::test_a[1]
12.25s call     tests/slurm/test_study_slurm.py::test_a[1]
2.00s call     tests/slurm/test_study_slurm.py::test_b
0.50s teardown tests/test_x.py::test_c
3.00s call     tests/test_x.py::test_c
(12 durations < 0.005s hidden.  Use -vv to show these durations.)
"""


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("suite_durations", REPO / "benchmarks" / "suite_durations.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_durations_are_summed_per_file_and_phase_slowest_first(tmp_path: Path) -> None:
    script = _script()
    files = script.per_file(REPORT)
    assert dict(files) == {
        "tests/slurm/test_study_slurm.py": {"setup": 30.5, "call": 14.25, "teardown": 0.0, "tests": 2},
        "tests/test_x.py": {"setup": 0.0, "call": 3.0, "teardown": 0.5, "tests": 1}}
    assert script.table(files, top=5).splitlines()[2:] == [
        "| tests/slurm/test_study_slurm.py | 2 | 30 | 14 | 0 | 45 | 93% |",
        "| tests/test_x.py | 1 | 0 | 3 | 0 | 4 | 7% |",
        "| all 2 files | 3 | | | | 48 | |"]
