"""`python -m abtune.tracking.dashboard HOST PORT`: optuna-dashboard on the storage named in the
environment (ABTUNE_DASHBOARD_STORAGE), so a storage password never shows in the process list."""

from __future__ import annotations

import os
import sys

from abtune.tracking.servers import DASHBOARD_STORAGE_VARIABLE


def main(argv: list[str]) -> int:
    import optuna_dashboard

    host, port = argv
    optuna_dashboard.run_server(os.environ[DASHBOARD_STORAGE_VARIABLE], host=host, port=int(port))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
