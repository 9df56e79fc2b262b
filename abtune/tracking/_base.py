"""The tracking contract the CLI and the study runner call; this base records nothing (--no-tracking)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from abtune.attrs import DDP, PAPER_DEFAULTS, REFERENCE_ATTR, RUN_ID_ATTR
from abtune.config import RunConfig
from abtune.tracking.view import search_params

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

REFERENCE_NAMES = {DDP: "DDP reference", PAPER_DEFAULTS: "paper defaults"}  # by the trial's REFERENCE_ATTR
REFERENCE_TAG = "abtune.reference"  # on a reference trial's run: ddp or paper-defaults
RECOMMENDED_TAG = "abtune.recommended"  # on the run of the trial the study recommends: "true"


def trial_run_name(number: int, reference: str | None) -> str:
    """`trial-7`; a reference trial says what it is: `trial-1 · DDP reference`."""
    label = REFERENCE_NAMES.get(reference or "")
    return f"trial-{number}" + (f" · {label}" if label else "")


@dataclass(frozen=True)
class LaunchInfo:
    """Where a run goes: recorded as params."""

    launcher: str = "local"
    world_size: int = 1
    ranks_per_node: int = 1

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
                  tags: dict[str, Any] | None = None, launch_info: LaunchInfo | None = None,
                  required: bool = True, params: dict[str, Any] | None = None) -> str | None:
        """Create the run and log its params (the config's, then `params`); return its id (goes into hooks.yaml via `hook_spec`). A store
        that fails raises TrackingUnavailable, or with `required` False (a study's trials, once it runs)
        warns once per process and returns None: the run goes on untracked."""
        return None

    def start_trial_run(self, config: RunConfig, trial: Any, *, study_name: str, parent_run_id: str | None,
                        launch_info: LaunchInfo | None = None) -> str | None:
        """A trial's child run under the study's parent, linked both ways: tags `optuna.study` and
        `optuna.trial_number` on the run, user attr `mlflow_run_id` on the Optuna trial. None when the store
        fails: the study goes on, the trial untracked."""
        reference = trial.user_attrs.get(REFERENCE_ATTR)
        run_name = trial_run_name(trial.number, reference)
        tags = {"optuna.study": study_name, "optuna.trial_number": trial.number,
                **({REFERENCE_TAG: reference} if reference else {})}
        run_id = self.start_run(config, experiment=study_name, run_name=run_name, parent_run_id=parent_run_id,
                                launch_info=launch_info, required=False, tags=tags,
                                params=search_params(dict(trial.params)))
        if run_id is not None:
            trial.set_user_attr(RUN_ID_ATTR, run_id)
        return run_id

    def hook_spec(self, run_id: str | None) -> dict[str, Any] | None:
        """The entry for RUN_DIR/hooks.yaml that makes rank 0 log into `run_id` (no secrets in it)."""
        return None

    def finish_run(self, run_id: str | None, run_dir: Path | None, status: str = "FINISHED") -> str:
        """Replay what rank 0 could not log, log results and artifacts, close the run.

        `status`: FINISHED, FAILED or KILLED. Returns complete | replayed | incomplete | off.
        """
        return "off"

    def log_metrics(self, run_id: str | None, metrics: dict[str, float]) -> None:
        """Log values (step 0) into a run, e.g. the means and spreads of a repeated trial."""

    def show_recommendation(self, parent_run_id: str | None, tags: dict[str, str], metrics: dict[str, float],
                            recommended_run: str | None, step: int = 0) -> None:
        """The study's answer on its parent run: `tags` (the recommendation's text among them, shown in the run's
        description with the study's text and plots), `metrics` at `step` (the finished trials it was decided
        from), and `abtune.recommended = true` on `recommended_run` only (None: on no run)."""

    def study_parent_run(self, study_name: str, storage: str) -> str | None:
        """The parent run of a study (one experiment per study), created once, found again on resume."""
        return None

    def close_study_parent_run(self, study_name: str, status: str) -> None:
        """End the study's parent run if one is open (`study stop` of a study whose runner died)."""

    def log_report(self, experiment: str, run_name: str, files: list[Path], tags: dict[str, str]) -> str | None:
        """A run holding only report files (tables, CSV, plots) as artifacts."""
        return None

    def start_group(self, experiment: str, run_name: str, tags: dict[str, str]) -> str | None:
        """A run that trains nothing itself and holds others (they name it as their parent), e.g. one
        `abtune compare`; raises when the store refuses it, before anything starts."""
        return None

    def finish_group(self, run_id: str | None, files: list[Path], status: str = "FINISHED", folder: str | None = None) -> None:
        """Log `files` as the group's artifacts (under `folder`) and end it."""

    def describe_study(self, parent_run_id: str | None, description: str, params: dict[str, Any],
                       progress: dict[str, float], step: int = 0) -> None:
        """The study's parent run says what the study is: `description` (markdown) at the top of its page with
        the study plots under it, `params` (its settings; each logged once), `progress` as metrics at `step` (the
        number of finished trials)."""

    def update_study_artifacts(self, parent_run_id: str | None, trials: Sequence[FrozenTrial],
                               objectives: Sequence[str] | None, analysis: dict[str, Any] | None = None,
                               recommended: int | None = None) -> None:
        """Pareto front, importances, optimization history of a study, as PNGs on the parent run, drawn from
        every trial (the reference trials included) on the study's `objectives` (Optuna's metric names);
        `analysis` (the study's parameter importances and inert parameters) as importances.json and its plot.
        `recommended`: the number of the trial the study recommends, marked on the front. The parent run's description
        shows the plots once rewritten (describe_study, show_recommendation)."""
