"""Follow a submitted run from the login node: one line when the job's state changes, and the
latest step from RUN_DIR/metrics.jsonl (written by rank 0) at most every PROGRESS_SECONDS."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, TextIO

from abtune.launch.base import Job, RunOutcome
from abtune.runfiles import METRICS_FILE

PROGRESS_SECONDS = 30.0


def latest_record(run_dir: Path) -> dict[str, Any] | None:
    """The last complete line of metrics.jsonl (a line being written is skipped)."""
    path = run_dir / METRICS_FILE
    if not path.exists():
        return None
    for line in reversed(path.read_text().splitlines()):
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            continue
    return None


def follow(job: Job, out: TextIO, poll_s: float) -> RunOutcome:
    last_state, last_print = "", 0.0
    while (result := job.poll()) is None:
        state = job.state
        record = latest_record(job.run_dir)
        now = time.monotonic()
        if state == "UNKNOWN":  # not in sacct yet
            pass
        elif state != last_state or (record and now - last_print >= PROGRESS_SECONDS):
            step = f"  step {record['step']} ({record.get('phase', '')})" if record else ""
            print(f"{job.describe()}: {state}{step}", file=out, flush=True)
            last_state, last_print = state, now
        time.sleep(poll_s)
    return result
