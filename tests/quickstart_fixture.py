"""The quickstart study as `abtune study run` leaves it (studies/quickstart.yaml as shipped, run on
2026-11-26): its eight trials' parameters and results stored without training, for the tests of what a
user reads (`study best`, the study plots, promote)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.distributions import FloatDistribution
from optuna.trial import create_trial

from abtune.attrs import RUN_DIR_ATTR
from abtune.study import lifecycle

STUDIES = Path(__file__).resolve().parent.parent / "studies"
SPACE = {"method.warmup_frac": FloatDistribution(0.1, 0.3), "method.ab_frac": FloatDistribution(0.015, 0.07, log=True),
         "method.rebound_frac": FloatDistribution(0.1, 0.5), "method.lr_rebound_frac": FloatDistribution(0.25, 1.0),
         "method.sigma_cutoff": FloatDistribution(0.04, 0.3, log=True)}
# (params in SPACE's order, reference, top-1, inter-node bytes, compression, evaluations (step, top-1, bytes))
TRIALS = [
    ((0.2, 0.03333, 0.25, 0.5, 0.1), 'paper-defaults', 0.95, 56526770.0, 2.8505, ((100, 0.9333, 56637143), (200, 0.9472, 56566064), (300, 0.95, 56526770))),
    (None, 'ddp', 0.95, 140409068.0, 1.0, None),
    ((0.1787, 0.03548, 0.15182, 0.63712, 0.07855), None, 0.9472222222222222, 46876640.0, 2.1157, ((100, 0.9167, 47081580), (200, 0.9417, 46933539), (300, 0.9472, 46876640))),
    ((0.24906, 0.02999, 0.10679, 0.77027, 0.16206), None, 0.9472222222222222, 47991332.0, 4.1658, ((100, 0.9389, 48043933), (200, 0.9472, 47997957), (300, 0.9472, 47991332))),
    ((0.10761, 0.0672, 0.49723, 0.25616, 0.04073), None, 0.9611111111111111, 59982422.0, 1.1261, ((100, 0.9278, 60151377), (200, 0.9611, 60044094), (300, 0.9611, 59982422))),
    ((0.1162, 0.01571, 0.37091, 0.92534, 0.27167), None, 0.9, 54246736.0, 6.4462, ((100, 0.8583, 54245680), (200, 0.8917, 54246384), (300, 0.9, 54246736))),
    ((0.28918, 0.06335, 0.10036, 0.63027, 0.04004), None, 0.95, 54659728.0, 1.1292, ((100, 0.9528, None), (200, 0.9528, 54676031), (300, 0.95, 54659728))),
    ((0.17191, 0.03363, 0.24696, 0.38453, 0.08734), None, 0.9527777777777777, 47137602.0, 2.4619, ((100, 0.9167, 47329286), (200, 0.95, 47194307), (300, 0.9528, 47137602))),
]
DDP_TRIAL, PAPER_TRIAL = 1, 0


def quickstart_trials() -> list[optuna.trial.FrozenTrial]:
    """The trials numbered as the study stores them."""
    trials = [_trial(*row) for row in TRIALS]
    for number, trial in enumerate(trials):
        trial.number = number
    return trials


def _trial(params: tuple[float, ...] | None, reference: str | None, top1: float, nbytes: float, compression: float,
           evaluations: tuple[tuple[int, float, float | None], ...] | None) -> optuna.trial.FrozenTrial:
    attrs: dict[str, Any] = {"top1": top1, "inter_node_bytes": nbytes, "compression": compression,
                             RUN_DIR_ATTR: "runs/studies/quickstart/trials/N"}
    if reference:
        attrs["reference"] = reference
    if evaluations:
        attrs["evaluations"] = {str(s): {"top1": t, "inter_node_bytes": b} for s, t, b in evaluations}
    chosen = dict(zip(SPACE, params, strict=True)) if params else {}
    return create_trial(params=chosen, distributions={k: SPACE[k] for k in chosen}, values=[top1, nbytes],
                        user_attrs=attrs)


def quickstart_study(folder: Path, trials: list[optuna.trial.FrozenTrial] | None = None) -> str:
    """studies/quickstart.yaml created in `folder`'s own storage, with the eight trials (or `trials`) stored; its URL."""
    spec = yaml.safe_load((STUDIES / "quickstart.yaml").read_text())
    spec.update(base=str(STUDIES / spec["base"]), study_dir=str(folder / "trials"),
                references={"paper_defaults": False, "ddp": False})  # the stored trials carry them
    path = folder / "quickstart.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    url = f"sqlite:///{folder / 'optuna.db'}"
    lifecycle.create(path, None, url, force=False)
    study = optuna.load_study(study_name="quickstart", storage=url)
    for number, trial in enumerate(quickstart_trials() if trials is None else trials):
        trial.user_attrs[RUN_DIR_ATTR] = str(folder / "trials" / str(number))
        study.add_trial(trial)
    return url
