"""The tracking contract the CLI and the study runner call; this base records nothing (--no-tracking)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from abtune.config import RunConfig


@dataclass(frozen=True)
class LaunchInfo:
    """Where a run goes: recorded as params."""

    launcher: str = "local"
    world_size: int = 1
    ranks_per_node: int = 1
    slurm_job_id: str | None = None

    @property
    def nodes(self) -> int:
        return max(1, self.world_size // max(1, self.ranks_per_node))


class Tracking:
    """Called by the orchestrating process (never by ranks): start a run, hand rank 0 a hook, finish it.

    A run id of None means "not tracked"; every method accepts it and does nothing.
    """

    HOOK_FACTORY = "abtune.tracking.hook:make_hook"

    def describe(self) -> str:
        return "off"

    def start_run(self, config: RunConfig, *, experiment: str, run_name: str, parent_run_id: str | None = None,
                  tags: dict[str, Any] | None = None, launch: LaunchInfo | None = None) -> str | None:
        """Create the run and log its params; return its id (goes into hooks.yaml via `hook_spec`)."""
        return None

    def hook_spec(self, run_id: str | None) -> dict[str, Any] | None:
        """The entry for RUN_DIR/hooks.yaml that makes rank 0 log into `run_id` (no secrets in it)."""
        return None

    def finish_run(self, run_id: str | None, run_dir: Path | None, status: str = "FINISHED") -> str:
        """Replay what rank 0 could not log, log results and artifacts, close the run.

        `status`: FINISHED, FAILED or KILLED. Returns complete | replayed | incomplete | off.
        """
        return "off"

    def study_parent_run(self, study_name: str, storage: str) -> str | None:
        """The parent run of a study (one experiment per study), created once, found again on resume."""
        return None

    def update_study_artifacts(self, parent_run_id: str | None, study: Any) -> None:
        """Pareto front, importances, optimization history of an Optuna study, as PNGs on the parent run."""
