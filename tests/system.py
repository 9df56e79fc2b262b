"""What the suite brings up on the machine itself: the Debian packages its fixtures need.

The SLURM cluster (tests/slurm: `cluster.sh install`), PostgreSQL (tests/postgres: `pg.sh install`) and
the emulated interconnect (tests/test_fabric.py: iproute2, iptables) all work the same way: as root, a
missing package is installed with apt-get, one install at a time whichever pytest worker asks; where it
cannot be (not root, no apt-get, apt-get failed), the tests that need it skip with the reason, and fail
instead under CI=true, where nothing may be skipped silently. So the README's `pytest -q` passes on a
fresh machine wherever `.ci/run` does.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NoReturn

import pytest

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
INSTALL_TIMEOUT_S = 900
LOCK_WAIT_S = 600  # for the dpkg lock another apt-get (not ours) may hold
_APT_LOCK = Path(tempfile.gettempdir()) / "abtune-apt.lock"


def unavailable(what: str, reason: str) -> NoReturn:
    """Skip locally, but never silently skip in CI."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} cannot run here (CI=true, so not skipping): {reason}", pytrace=False)
    pytest.skip(f"{what} unavailable: {reason}")


@contextlib.contextmanager
def one_install_at_a_time() -> Iterator[None]:
    """apt-get and dpkg refuse to run twice at once: the fixtures of pytest's workers take turns."""
    with _APT_LOCK.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def apt_get_install(packages: Sequence[str]) -> str | None:
    """Install the Debian packages not installed yet (root); None once done, else why not, in one line."""
    packages = [p for p in packages if not _installed(p)]
    if not packages:
        return None
    if os.geteuid() != 0:
        return "installing it (apt-get) needs root"
    apt = shutil.which("apt-get", path=SYSTEM_PATH)
    if apt is None:
        return "no apt-get on this machine to install it"
    install = [apt, "-o", f"DPkg::Lock::Timeout={LOCK_WAIT_S}", "install", "-y", "-qq", "--no-install-recommends",
               *packages]
    with one_install_at_a_time():
        if _apt(install) is None:  # the package lists are there already
            return None
        failed = _apt([apt, "update", "-qq"]) or _apt(install)
    return None if failed is None else f"`apt-get install {' '.join(packages)}` failed: {failed}"


def _installed(package: str) -> bool:
    dpkg_query = shutil.which("dpkg-query", path=SYSTEM_PATH)
    if dpkg_query is None:
        return False
    status = subprocess.run([dpkg_query, "-W", "-f=${Status}", package], capture_output=True, text=True)
    return status.stdout.endswith(" installed")


def _apt(command: list[str]) -> str | None:
    """None when `command` succeeded, else the last line it printed."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive", "PATH": SYSTEM_PATH}
    try:
        done = subprocess.run(command, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=INSTALL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"timed out after {INSTALL_TIMEOUT_S} s"
    lines = (done.stdout + done.stderr).strip().splitlines()
    return None if done.returncode == 0 else (lines[-1] if lines else f"exit code {done.returncode}")
