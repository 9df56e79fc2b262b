"""The importances plot says what `study best` says: each bar's p-value against shuffled objective values,
and, when no parameter beats the shuffles, that the ranking is indistinguishable from them."""

from __future__ import annotations

from pathlib import Path

from abtune.tracking import plots

IMPORTANCES = {"top1": {"method.sigma_cutoff": 0.6, "method.ab_frac": 0.4},
               "inter_node_bytes": {"method.warmup_frac": 0.9, "method.ab_frac": 0.1}}


def test_an_objective_no_parameter_of_which_beats_the_shuffles_says_so(tmp_path: Path) -> None:
    p_values = {"top1": {"method.sigma_cutoff": 0.35, "method.ab_frac": 0.6},
                "inter_node_bytes": {"method.warmup_frac": 0.05, "method.ab_frac": 0.9}}
    drawn = plots.importances(IMPORTANCES, 7, tmp_path / "importances.png", p_values, 0.05)
    said = [t for t in drawn.texts if "indistinguishable from shuffled values" in t]
    assert len(said) == 1 and said[0].startswith("importance for top-1")  # traffic's warmup_frac beats them
    assert {" p=0.35", " p=0.60", " p=0.05", " p=0.90"} <= set(drawn.texts)


def test_without_p_values_the_plot_claims_nothing_about_them(tmp_path: Path) -> None:
    drawn = plots.importances(IMPORTANCES, 30, tmp_path / "importances.png")
    assert not [t for t in drawn.texts if "shuffled" in t or t.startswith(" p=")]
