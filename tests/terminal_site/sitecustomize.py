"""Imported by the Python of an `abtune` command that tests/terminal.py starts in a terminal (this folder is on
its PYTHONPATH): the importances that the test session computed are read, not fitted again
(tests/importance_cache.py), as in the test's own process."""

import os

if os.environ.get("ABTUNE_TESTS_IMPORTANCES"):
    from pathlib import Path

    from abtune.study import importance
    from tests.importance_cache import FOLDER_VARIABLE, computed_once

    importance._importances_of = computed_once(importance._importances_of, Path(os.environ[FOLDER_VARIABLE]))
