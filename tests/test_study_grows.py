"""A study that grows: `study run --add-trials N` raises the budget keeping every trial, a spent study says
that nothing ran and how to add trials, and a study file whose only change is `trials:` sets the budget."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
import yaml

from abtune.study import lifecycle
from abtune.study.storage import open_storage
from tests import cli_fixture
from tests.cli_fixture import Result
from tests.conftest import CliResult
from tests.quickstart_fixture import quickstart_study
from tests.study_cli import in_process
from tests.study_helpers import trials_of, write_study

Abtune = Callable[..., CliResult]

cli = cli_fixture.cli  # the in-process `abtune` fixture


def test_a_spent_study_says_nothing_ran_and_grows_by_its_file_or_add_trials(tmp_path: Path, cli: Callable[..., Result]) -> None:
    url = quickstart_study(tmp_path)  # eight trials, budget 8: spent
    spent = cli("study", "run", "quickstart", "--storage", url, "--no-tracking")
    assert spent.returncode == 0
    first = spent.stdout.splitlines()[0]
    assert first == (f"study quickstart: budget spent, nothing ran; add trials with `abtune study run quickstart "
                     f"--storage {url} --no-tracking --add-trials N`"), spent.stdout
    path = tmp_path / "quickstart.yaml"
    path.write_text(path.read_text().replace("trials: 8", "trials: 11"))
    grown = cli("study", "create", str(path), "--storage", url)
    assert grown.stdout.startswith("study quickstart in ") and "budget set to 11 trials (was 8); its trials are kept" \
        in grown.stdout, grown.stdout
    assert lifecycle.budget(open_storage(url), "quickstart") == 11
    assert len(optuna.load_study(study_name="quickstart", storage=url).trials) == 8
    assert "budget 8/11 finished" in cli("study", "status", "quickstart", "--storage", url).stdout
    with pytest.raises(Exception, match="--add-trials must be at least 1, got 0"):
        lifecycle.add_trials(open_storage(url), "quickstart", 0)


@pytest.mark.slow
def test_add_trials_grows_a_spent_study_without_losing_a_trial(tmp_path: Path, abtune_main: Abtune) -> None:
    url = f"sqlite:///{tmp_path}/optuna.db"
    study = write_study(tmp_path / "s.yaml", trials=1, references={"paper_defaults": False, "ddp": False})
    in_process(abtune_main, "study", "create", str(study), "--storage", url, cwd=tmp_path)
    in_process(abtune_main, "study", "run", "tiny", "--storage", url, "--no-tracking", cwd=tmp_path)
    before = trials_of(url)
    again = in_process(abtune_main, "study", "run", "tiny", "--storage", url, "--no-tracking", cwd=tmp_path).stdout
    assert again.startswith("study tiny: budget spent, nothing ran") and len(trials_of(url)) == 1
    grown = in_process(abtune_main, "study", "run", "tiny", "--storage", url, "--no-tracking", "--add-trials", "2",
                       cwd=tmp_path).stdout
    assert grown.startswith("study tiny: budget raised from 1 to 3 trials; every trial so far is kept"), grown
    after = trials_of(url)
    assert [t.state.name for t in after] == ["COMPLETE"] * 3
    assert (after[0].number, after[0].params, after[0].values) == (before[0].number, before[0].params, before[0].values)
    assert yaml.safe_load((tmp_path / "s.yaml").read_text())["trials"] == 1  # the file is the user's
