"""Smaller answers that lost part of the truth: AB on an odd number of ranks offered "choose one of (none...)",
`study best` handed a drill's link-down fault on to "run it again", and `--margin` beside a rule that ignores it
went unmentioned."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import yaml
from optuna.distributions import FloatDistribution
from optuna.trial import create_trial

from abtune.cli import main
from tests.conftest import REPO
from tests.study_helpers import write_study

MARGIN_NOTE = "abtune: note: --margin is read by --rule within-margin only; --rule best-accuracy ignores it"


@pytest.mark.parametrize(("nproc", "ranks_per_node"), [(5, 1), (3, 3)])
def test_ab_on_an_odd_number_of_ranks_says_to_use_an_even_number(nproc: int, ranks_per_node: int,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["train", str(REPO / "studies" / "run_quickstart.yaml"), "--nproc", str(nproc), "--ranks-per-node",
                 str(ranks_per_node), "--dry-run"])
    assert code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"abtune: error: method ab needs an even number of ranks (half of its equal groups train A, half B), got "
        f"{nproc}: use --nproc {nproc - 1} or {nproc + 1} (nodes x tasks_per_node in a launcher profile), or "
        "method ab-nogroups"]


def _study_with_a_trial(folder: Path, **attrs: object) -> None:
    """A two-objective study in folder/optuna.db with one finished search trial of these user attributes."""
    study = write_study(folder / "s.yaml", objectives=["top1", "inter_node_bytes"],
                        references={"paper_defaults": False, "ddp": False})
    assert main(["study", "create", str(study)]) == 0
    trial = create_trial(params={"method.warmup_frac": 0.2},
                         distributions={"method.warmup_frac": FloatDistribution(0.1, 0.3)}, values=[0.9, 5e6],
                         user_attrs={"top1": 0.9, "inter_node_bytes": 5e6, "compression": 1.0,
                                     "run_dir": "runs/studies/tiny/trials/0", **attrs})
    optuna.load_study(study_name="tiny", storage=f"sqlite:///{folder / 'optuna.db'}").add_trial(trial)


def _best(capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[str, str]:
    capsys.readouterr()
    assert main(["study", "best", "tiny", *flags]) == 0
    out, err = capsys.readouterr()
    return " ".join(out.split()), err


def test_run_it_again_says_when_the_profile_would_repeat_a_drills_faults(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    drill = tmp_path / "drill.yaml"
    drill.write_text(yaml.safe_dump({"kind": "local", "fabric": {"bandwidth": "1gbit", "faults": [
        {"at_step": 600, "node": 1, "link": "down"}, {"at_step": 200, "node": 0, "loss_pct": 3}]}}))
    _study_with_a_trial(tmp_path, launcher=str(drill))
    out, _ = _best(capsys)
    assert (f"run it again: abtune train runs/studies/tiny/trials/0/config.yaml --launcher {drill} --nproc 2 "
            f"--ranks-per-node 1 note: launcher {drill} injects fabric.faults (node 1 link down at step 600, node 0 "
            f"loss 3.0% at step 200), which that command repeats; to run the configuration alone, use a copy of "
            f"{drill} without faults") in out, out


def test_run_it_again_on_a_profile_without_faults_has_no_note(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    _study_with_a_trial(tmp_path, launcher="emulated")
    out, _ = _best(capsys)
    assert "--launcher emulated --nproc 2 --ranks-per-node 1" in out and "fabric.faults" not in out


def test_a_margin_beside_a_rule_that_ignores_it_is_named_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    _study_with_a_trial(tmp_path)
    assert _best(capsys, "--rule", "best-accuracy", "--margin", "0.05")[1].splitlines() == [MARGIN_NOTE]
    assert _best(capsys, "--rule", "within-margin", "--margin", "0.05")[1] == ""
    assert _best(capsys, "--rule", "best-accuracy")[1] == ""
    out, err = _best(capsys)
    assert err == "" and "within 0.01 top-1" in out  # the default margin, unchanged
