"""How a run ended, as every launcher reports it: ok, or the one-line cause and an exit code."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from abtune.runfiles import FAILURES_DIR

DISK_FULL = "no space left on device"
FULL_BELOW_BYTES = 1 << 20  # free space under which a failed run's file system counts as full
DISK_FULL_ERRORS = re.compile(r"\[Errno (28|122)\]|No space left on device|Disk quota exceeded")


@dataclass(frozen=True)
class RunOutcome:
    ok: bool
    reason: str | None = None
    exit_code: int = 0
    never_started: bool = False  # the launcher gave up on a job that could never start: nothing ran


def recorded_failure(run_dir: Path, crashes: bool = True) -> str | None:
    """The first line a failed rank wrote: an abtune error (NaN loss, bad value) before a crash (often an echo).
    `crashes=False` for a run the scheduler ended: a rank that outlived a killed peer for a moment records
    the broken connection, an echo of the kill, not its cause."""
    folder = run_dir / FAILURES_DIR
    for kind in ("error", "crash") if crashes else ("error",):
        found = first_lines(sorted(folder.glob(f"{kind}_rank_*.txt")))
        if found:
            return found[0]
    return None


def first_lines(files: Sequence[Path]) -> list[str]:
    """The first line of each file that holds one: a rank that failed on a full disk leaves an empty file."""
    lines = [path.read_text().strip().splitlines() for path in files]
    return [found[0] for found in lines if found]


def disk_full(run_dir: Path, logs: Sequence[Path] = ()) -> str | None:
    """Why a run that left no cause ended, when it is a full disk: its `logs` (the job's own output) say so,
    or the file system of its folder is (almost) full. One line naming the folder and what to do."""
    said = any(DISK_FULL_ERRORS.search(_tail(path)) for path in logs)
    try:
        stat = os.statvfs(run_dir)
    except OSError:
        return None
    free = stat.f_bavail * stat.f_frsize
    if not said and free >= FULL_BELOW_BYTES:
        return None
    return (f"{DISK_FULL} in {run_dir} ({free / 1024:,.0f} KiB free); free space there or choose a folder on "
            "another file system (the study's study_dir, --run-dir), then run it again")


def is_disk_full(reason: str | None) -> bool:
    return DISK_FULL in (reason or "").lower()


def _tail(path: Path, size: int = 1 << 16) -> str:
    try:
        with path.open("rb") as log:
            log.seek(max(0, path.stat().st_size - size))
            return log.read().decode(errors="replace")
    except OSError:
        return ""
