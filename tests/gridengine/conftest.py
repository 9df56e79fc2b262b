"""Session fixture bringing up a real one-host Grid Engine cell on this machine (see cell.sh / README.md).

Set ABTUNE_SGE_STATE_DIR to reuse a cell you started yourself with `sudo cell.sh up DIR` (used as is if
`cell.sh status DIR` says it is up; otherwise brought up; left running afterwards).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from abtune.launch.base import exported
from tests import system

CELL_SH = Path(__file__).resolve().parent / "cell.sh"
_NEEDED = ("sge_qmaster", "sge_execd", "qsub", "qstat", "qdel", "qconf", "qacct")
_SBIN_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
_UP_TIMEOUT_S = 180
_DOWN_TIMEOUT_S = 180


@dataclasses.dataclass(frozen=True)
class GridEngineCell:
    state_dir: Path
    env: dict[str, str]
    queue: str = "all.q"
    parallel_environment: str = "smp"
    slots: int = 4


def _run(args: list[str], log: Path, timeout: float) -> tuple[int, str]:
    """Run cell.sh with output to a file (the daemons it starts must not hold our pipes open)."""
    with log.open("a") as fh:
        fh.write(f"$ {' '.join(args)}\n")
        fh.flush()
        try:
            rc = subprocess.run(["bash", str(CELL_SH), *args], stdin=subprocess.DEVNULL, stdout=fh,
                                stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = -1
            fh.write(f"cell.sh {args[0]} timed out after {timeout}s\n")
    return rc, "\n".join(log.read_text().splitlines()[-30:])


def _cell_env(state_dir: Path) -> dict[str, str]:
    """The SGE_* variables `cell.sh up` wrote to STATE_DIR/env.sh (`export A=1 B=2`)."""
    words = (state_dir / "env.sh").read_text().split()[1:]
    return dict(word.split("=", 1) for word in words)


@pytest.fixture(scope="session")
def gridengine_cell() -> Iterator[GridEngineCell]:
    reuse = os.environ.get("ABTUNE_SGE_STATE_DIR")
    if reuse:
        state_dir = Path(reuse).resolve()
        status = subprocess.run(["bash", str(CELL_SH), "status", str(state_dir)], stdin=subprocess.DEVNULL,
                                capture_output=True, timeout=60)
        if status.returncode == 0:
            yield from _use(GridEngineCell(state_dir=state_dir, env=_cell_env(state_dir)))
            return

    missing = [c for c in _NEEDED if shutil.which(c, path=_SBIN_PATH) is None]
    if os.geteuid() != 0:
        system.unavailable("Grid Engine test cell", "needs root to start sge_qmaster/sge_execd"
                           + (f"; also missing: {', '.join(missing)}" if missing else ""))

    if reuse:
        state_dir.mkdir(parents=True, exist_ok=True)
    else:
        # Not pytest's tmp_path: its /tmp/pytest-of-root parent is mode 0700, which sgeadmin cannot traverse.
        state_dir = Path(tempfile.mkdtemp(prefix="abtune-sge-", dir="/tmp"))
    state_dir.chmod(0o755)
    log = state_dir / "cell-sh.log"

    if missing:
        with system.one_install_at_a_time():
            rc, tail = _run(["install"], log, system.INSTALL_TIMEOUT_S)
        if rc != 0:
            system.unavailable("Grid Engine test cell",
                               f"`cell.sh install` failed (rc={rc}); missing {', '.join(missing)}:\n{tail}")

    rc, tail = _run(["up", str(state_dir)], log, _UP_TIMEOUT_S)
    if rc != 0:
        _run(["down", str(state_dir)], log, _DOWN_TIMEOUT_S)
        pytest.fail(f"`cell.sh up {state_dir}` failed (rc={rc}):\n{tail}", pytrace=False)

    try:
        yield from _use(GridEngineCell(state_dir=state_dir, env=_cell_env(state_dir)))
    finally:
        if not reuse:
            rc, tail = _run(["down", str(state_dir)], log, _DOWN_TIMEOUT_S)
            if rc != 0:
                pytest.fail(f"`cell.sh down {state_dir}` failed (rc={rc}):\n{tail}", pytrace=False)
            shutil.rmtree(state_dir, ignore_errors=True)


@pytest.fixture(autouse=True)
def _delete_what_the_test_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that fails before its own qdel would leave its job taking the CPU from every test after it."""
    yield
    if "gridengine_cell" in request.fixturenames and os.environ.get("SGE_ROOT") and shutil.which("qdel"):
        subprocess.run(["qdel", "-u", "*"], stdin=subprocess.DEVNULL, capture_output=True, timeout=60,
                       check=False)


def _use(cell: GridEngineCell) -> Iterator[GridEngineCell]:
    """Point qsub, qstat, qdel and qacct at the cell for the session."""
    with exported(cell.env):
        yield cell
