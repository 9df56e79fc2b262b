"""Warm start across scales: a study created with `--warm-start OLD` runs OLD's front first, in the order of
OLD's recommendation, carrying only the parameters (and values) its own space searches."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import optuna
import yaml
from optuna.trial import TrialState

from abtune.attrs import REFERENCE_ATTR, WARM_START_ATTR
from tests import cli_fixture
from tests.cli_fixture import Result
from tests.quickstart_fixture import quickstart_study, quickstart_trials

cli = cli_fixture.cli  # the in-process `abtune` fixture


def test_a_warm_started_study_s_first_trials_are_the_old_front(tmp_path: Path, cli: Callable[..., Result]) -> None:
    url = quickstart_study(tmp_path)  # DDP 0.95: the front ranked 2, 7, 4 (tests/test_recommendation_record.py)
    spec = yaml.safe_load((tmp_path / "quickstart.yaml").read_text())
    del spec["space"]["method.lr_rebound_frac"]  # not searched at the new scale: left to the base config
    spec["space"]["method.sigma_cutoff"] = {"low": 0.05, "high": 0.3, "log": True}  # trial 4's 0.04073 is outside
    spec.update(name="quickstart-4n", layout={"nproc": 4, "ranks_per_node": 1}, study_dir=str(tmp_path / "new"),
                references={"paper_defaults": True, "ddp": True})
    path = tmp_path / "quickstart-4n.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    out = cli("study", "create", str(path), "--storage", url, "--warm-start", "quickstart")
    assert out.returncode == 0, out.stderr
    assert ("warm start: 3 trials of study quickstart enqueued first (quickstart #2, quickstart #7, quickstart #4: "
            "its confirmed picks, then its Pareto front)") in out.stdout, out.stdout
    new = optuna.load_study(study_name="quickstart-4n", storage=url).get_trials(deepcopy=False)
    assert all(t.state == TrialState.WAITING for t in new)
    assert [t.user_attrs.get(WARM_START_ATTR) for t in new[:3]] == ["quickstart #2", "quickstart #7", "quickstart #4"]
    assert [t.user_attrs.get(REFERENCE_ATTR) for t in new[3:]] == ["paper-defaults", "ddp"]
    old = quickstart_trials()
    for trial, number in zip(new[:3], (2, 7, 4), strict=True):
        carried = {k: v for k, v in old[number].params.items() if k in spec["space"]}
        if number == 4:
            del carried["method.sigma_cutoff"]  # outside the new bounds: the sampler chooses it
        assert trial.system_attrs["fixed_params"] == carried
    missing = cli("study", "create", str(path), "--storage", url, "--warm-start", "nope", "--name", "other")
    assert missing.returncode == 2 and missing.stderr.startswith("abtune: error: no study named 'nope'"), missing.stderr
