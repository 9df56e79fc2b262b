"""`abtune train` of a test's config in the test's own process: conftest's `train_and_read` without the new Python
(start-up and the CLI's imports: about a CPU-second a run), for tests that read only what the run wrote."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conftest import CliResult, train_args
from tests.study_cli import in_process


def train_here(abtune_main: Callable[..., CliResult], config: Path, run_dir: Path, nproc: int, ranks_per_node: int,
               *extra: str) -> dict[str, Any]:
    """`abtune train` on local ranks, untracked as `train_and_read` is, and the summary.json it wrote."""
    from abtune.runfiles import read_summary

    in_process(abtune_main, *train_args(config, run_dir, nproc, ranks_per_node, *extra))
    return read_summary(run_dir).raw
