"""Session fixture bringing up a real two-node SLURM cluster on this machine (see cluster.sh / README.md).

Set ABTUNE_SLURM_STATE_DIR to reuse a cluster you started yourself with `sudo cluster.sh up DIR`
(used as is if `cluster.sh status DIR` says it is up, even by a non-root user; otherwise brought up;
left running afterwards).
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

from tests import system
from tests.slurm.prompt_kill import prompt_kill

CLUSTER_SH = Path(__file__).resolve().parent / "cluster.sh"
_NEEDED = ("slurmctld", "slurmd", "slurmdbd", "sinfo", "sacct", "srun", "munged", "mariadbd")
_SBIN_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
_UP_TIMEOUT_S = 300
_DOWN_TIMEOUT_S = 300


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slurm: runs jobs on the real single-machine SLURM test cluster")


@dataclasses.dataclass(frozen=True)
class SlurmCluster:
    state_dir: Path
    slurm_conf: Path
    partition: str = "debug"
    nodes: tuple[str, ...] = ("n1", "n2")


def _unavailable(reason: str) -> None:
    system.unavailable("SLURM test cluster", reason)


def _run(args: list[str], log: Path, timeout: float) -> tuple[int, str]:
    """Run cluster.sh with output to a file (the daemons it starts must not hold our pipes open)."""
    with log.open("a") as fh:
        fh.write(f"$ {' '.join(args)}\n")
        fh.flush()
        try:
            rc = subprocess.run(
                ["bash", str(CLUSTER_SH), *args],
                stdin=subprocess.DEVNULL,
                stdout=fh,
                stderr=subprocess.STDOUT,
                timeout=timeout,
            ).returncode
        except subprocess.TimeoutExpired:
            rc = -1
            fh.write(f"cluster.sh {args[0]} timed out after {timeout}s\n")
    tail = "\n".join(log.read_text().splitlines()[-30:])
    return rc, tail


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    reuse = os.environ.get("ABTUNE_SLURM_STATE_DIR")
    if reuse:
        state_dir = Path(reuse).resolve()
        status = subprocess.run(
            ["bash", str(CLUSTER_SH), "status", str(state_dir)],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=60,
        )
        if status.returncode == 0:
            yield from _use(SlurmCluster(state_dir=state_dir, slurm_conf=state_dir / "etc" / "slurm.conf"))
            return

    missing = [c for c in _NEEDED if shutil.which(c, path=_SBIN_PATH) is None]
    if os.geteuid() != 0:
        _unavailable(
            "needs root to start munged/mariadbd/slurm daemons as their users"
            + (f"; also missing: {', '.join(missing)}" if missing else "")
        )

    if reuse:
        state_dir.mkdir(parents=True, exist_ok=True)
    else:
        # Not pytest's tmp_path: its /tmp/pytest-of-root parent is mode 0700, which the slurm,
        # munge and mysql users cannot traverse.
        state_dir = Path(tempfile.mkdtemp(prefix="abtune-slurm-", dir="/tmp"))
    state_dir.chmod(0o755)
    log = state_dir / "cluster-sh.log"

    if missing:
        with system.one_install_at_a_time():
            rc, tail = _run(["install"], log, system.INSTALL_TIMEOUT_S)
        if rc != 0:
            _unavailable(f"`cluster.sh install` failed (rc={rc}); missing {', '.join(missing)}:\n{tail}")

    rc, tail = _run(["up", str(state_dir)], log, _UP_TIMEOUT_S)
    if rc != 0:
        _run(["down", str(state_dir)], log, _DOWN_TIMEOUT_S)
        pytest.fail(f"`cluster.sh up {state_dir}` failed (rc={rc}):\n{tail}", pytrace=False)

    try:
        yield from _use(SlurmCluster(state_dir=state_dir, slurm_conf=state_dir / "etc" / "slurm.conf"))
    finally:
        if not reuse:
            rc, tail = _run(["down", str(state_dir)], log, _DOWN_TIMEOUT_S)
            if rc != 0:
                pytest.fail(f"`cluster.sh down {state_dir}` failed (rc={rc}):\n{tail}", pytrace=False)
            shutil.rmtree(state_dir, ignore_errors=True)


@pytest.fixture(autouse=True)
def _cancel_what_the_test_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that fails before its own scancel (a training job of 100,000 steps, say) would leave its jobs
    taking the CPU from every test after it: whatever a test left in the cluster's queue is cancelled."""
    yield
    if "slurm_cluster" in request.fixturenames and os.environ.get("SLURM_CONF") and shutil.which("scancel"):
        subprocess.run(["scancel", "--user", str(os.getuid())], stdin=subprocess.DEVNULL, capture_output=True,
                       timeout=60, check=False)


@pytest.fixture
def killed_promptly(slurm_cluster: SlurmCluster) -> Iterator[None]:
    """The tasks of a job this test cancels or requeues get their SIGKILL at once, not 5 s later (prompt_kill.py)."""
    with prompt_kill(slurm_cluster.state_dir):
        yield


def _use(cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """Point the slurm tools (and submitit, which calls them) at the cluster for the session."""
    old_conf = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.slurm_conf)
    try:
        yield cluster
    finally:
        if old_conf is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old_conf
