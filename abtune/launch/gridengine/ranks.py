"""What a Grid Engine job runs (`python -m abtune.launch.gridengine.ranks RUN_DIR --ranks N`): the run's
ranks as processes on the job's host, then the outcome in a file the driver reads (`result_path`)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any

from abtune.errors import AbtuneError
from abtune.launch import local
from abtune.launch.gridengine.launcher import GridEngineLauncher, result_path, write_result
from abtune.launch.outcome import RunOutcome


def run_ranks(run_dir: Path, ranks: int, resume: bool) -> RunOutcome:
    try:
        local.launch(run_dir, ranks, ranks, resume=resume, job=GridEngineLauncher.rank_identity())
    except AbtuneError as error:
        return RunOutcome(False, str(error), error.exit_code)
    return RunOutcome(True)


def _stop(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m abtune.launch.gridengine.ranks")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--ranks", type=int, required=True)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)
    # qdel and h_rt send SIGKILL to the whole job; a SIGTERM from anything else stops the ranks too
    signal.signal(signal.SIGTERM, _stop)
    outcome = run_ranks(args.run_dir, args.ranks, args.resume)
    write_result(result_path(args.run_dir, os.environ.get("JOB_ID", "0")), outcome)
    return 0 if outcome.ok else outcome.exit_code


if __name__ == "__main__":
    sys.exit(main())
