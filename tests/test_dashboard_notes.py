"""What optuna-dashboard shows of a finished trial: traffic in MB beside the bytes, and a note that says what
the trial is (a reference trial which one), its result and its parameters rounded for reading."""

from __future__ import annotations

import optuna

from abtune.study import dashboard_notes


def test_a_reference_trial_is_labelled_and_its_figures_read_as_a_person_reads_them() -> None:
    from optuna_dashboard._note import get_note_from_system_attrs  # imports scikit-learn: not at collection

    study = optuna.create_study(directions=["maximize", "minimize"])
    study.enqueue_trial({"method.warmup_frac": 0.10135399851178005}, user_attrs={"reference": "paper-defaults"})
    trial = study.ask()
    trial.suggest_float("method.warmup_frac", 0.1, 0.3)
    attrs = {"top1": 0.93517, "inter_node_bytes": 47_140_123.0, "compression": 2.4567}
    dashboard_notes.annotate(trial, attrs)

    assert trial.user_attrs["inter_node_mb"] == 47.14  # beside the bytes, which stay exact
    note = get_note_from_system_attrs(study._storage.get_study_system_attrs(study._study_id), trial._trial_id)["body"]
    assert note.startswith("## Trial 0\n\n**Paper defaults**: the AB paper's guideline configuration")
    assert "top-1 **0.9352**, training inter-node **47.14 MB** per rank, compression **2.46:1**" in note
    assert "| method.warmup_frac | 0.1014 |" in note and "0.10135399851178005" not in note


def test_a_search_trial_has_no_reference_line() -> None:
    note = dashboard_notes.trial_note(4, {"method.sigma_cutoff": 0.05}, {"top1": 0.9})
    assert note == "## Trial 4\n\nResult: top-1 **0.9000**.\n\n| parameter | value |\n|---|---|\n| method.sigma_cutoff | 0.05 |"
