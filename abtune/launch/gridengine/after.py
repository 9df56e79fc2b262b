"""What a Grid Engine job submitted by `GridEngineLauncher.after` runs
(`python -m abtune.launch.gridengine.after BODY.pkl`): the pickled body, once the job it waited for has ended."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import cloudpickle

from abtune.launch.gridengine.launcher import result_path, write_result
from abtune.launch.outcome import RunOutcome


def main(argv: list[str] | None = None) -> int:
    pickled = Path((argv or sys.argv[1:])[0])
    body = cloudpickle.loads(pickled.read_bytes())
    said = body()
    print(said)
    write_result(result_path(pickled.parent.parent, os.environ.get("JOB_ID", "0")), RunOutcome(True, said))
    return 0


if __name__ == "__main__":
    sys.exit(main())
