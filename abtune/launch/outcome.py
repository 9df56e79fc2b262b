"""How a run ended, as every launcher reports it: ok, or the one-line cause and an exit code."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from abtune.runfiles import FAILURES_DIR


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
        files = sorted(folder.glob(f"{kind}_rank_*.txt"))
        if files:
            return files[0].read_text().splitlines()[0]
    return None
