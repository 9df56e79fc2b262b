"""One recommendation that weighs both objectives: `study best` names the configuration a rule chooses and
prints the rule; `promote` (and `study confirm`) choose by the same rule, with the same default."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from abtune.errors import ConfigError
from abtune.study import results
from abtune.study.ranking import DEFAULT_RULE, Rule, directions_of, pareto_front, rank_front
from tests.conftest import CliResult
from tests.quickstart_fixture import quickstart_trials

VIT_TARGET = Path(__file__).resolve().parent.parent / "studies" / "imagenet_vit_b16.yaml"
OBJECTIVES = ["top1", "inter_node_bytes"]


def _front() -> list:
    return results.pareto_front(results.search_trials(quickstart_trials()), OBJECTIVES)


def test_a_front_read_by_optuna_s_directions_is_the_front_read_by_the_objectives() -> None:
    """promote reads a confirmed study's front by its directions, study best by its objectives: one dominance."""
    trials = results.search_trials(quickstart_trials())
    by_directions = pareto_front(trials, directions_of(OBJECTIVES))
    assert sorted(t.number for t in by_directions) == sorted(t.number for t in _front()) == [2, 4, 7]


def test_the_default_rule_takes_the_least_traffic_within_a_point_of_the_best_top1() -> None:
    """The quickstart's front: trial 4 (0.9611, 59.98 MB), 7 (0.9528, 47.14 MB), 2 (0.9472, 46.88 MB)."""
    assert Rule("within-margin", 0.01) == DEFAULT_RULE
    ranked = [t.number for t in rank_front(_front(), directions_of(OBJECTIVES), DEFAULT_RULE)]
    assert ranked == [7, 4, 2]  # 4 and 7 within 0.01 of 0.9611, 7 sends less; then 2 by top-1
    assert [t.number for t in rank_front(_front(), directions_of(OBJECTIVES), Rule("within-margin", 0.02))][0] == 2
    assert [t.number for t in rank_front(_front(), directions_of(OBJECTIVES), Rule("within-margin", 0.0))][0] == 4
    assert [t.number for t in rank_front(_front(), directions_of(OBJECTIVES), Rule("best-accuracy"))][0] == 4
    assert DEFAULT_RULE.describe(OBJECTIVES) == ("within-margin (the default): of the Pareto front's trials within "
                                                 "0.01 top-1 of DDP's top-1, the one with the least inter-node MB")
    with pytest.raises(ConfigError, match=r"--margin must be a top-1 difference in \[0, 1\), e.g. 0.01"):
        Rule("within-margin", 1.5)


def _recommended(out: str) -> int:
    found = re.search(r"^recommended: trial (\d+) .*, chosen by rule (\S+)", out, re.MULTILINE)
    assert found, out
    return int(found.group(1))


def test_study_best_recommends_by_the_rule_and_says_which(quickstart: tuple[Path, str],
                                                          abtune_main: Callable[..., CliResult]) -> None:
    folder, url = quickstart
    out = abtune_main("study", "best", "quickstart", "--storage", url, cwd=folder).stdout
    assert _recommended(out) == 2  # within 0.01 of DDP's 0.95, the least traffic
    flat = " ".join(out.split())
    assert ("chosen by rule within-margin (the default): of the Pareto front's trials within 0.01 top-1 of DDP's "
            "top-1, the one with the least inter-node MB") in flat
    assert "the highest top-1 is trial 4's (0.9611); trial 2 has 0.9472 at inter-node MB 46.88 instead of 59.98" in flat
    assert f"run it again: abtune train {folder}/trials/2/config.yaml" in out
    best = abtune_main("study", "best", "quickstart", "--storage", url, "--rule", "best-accuracy", cwd=folder).stdout
    assert _recommended(best) == 4 and "the highest top-1 is" not in best
    assert _recommended(abtune_main("study", "best", "quickstart", "--storage", url, "--margin", "0", cwd=folder).stdout) == 7


def _rule_text(out: str) -> str:
    found = re.search(r"chosen by (rule .*?\))", " ".join(out.split()))
    assert found, out
    return found.group(1)


def test_study_status_recommends_what_study_best_does_by_the_same_rule(quickstart: tuple[Path, str],
                                                                      abtune_main: Callable[..., CliResult]) -> None:
    folder, url = quickstart
    status = abtune_main("study", "status", "quickstart", "--storage", url, cwd=folder).stdout
    flat = " ".join(status.split())
    assert "recommended so far: trial 2 (top-1 0.9472, inter-node MB 46.88), chosen by rule within-margin" in flat
    assert "the highest top-1 is trial 4's (0.9611); trial 2 has 0.9472 at inter-node MB 46.88 instead of 59.98" in flat
    assert "best so far" not in status
    best = abtune_main("study", "best", "quickstart", "--storage", url).stdout
    assert _rule_text(status) == _rule_text(best)  # the rule's words, as `study best` prints them
    by_accuracy = abtune_main("study", "status", "quickstart", "--storage", url, "--rule", "best-accuracy").stdout
    assert "recommended so far: trial 4 (top-1 0.9611, inter-node MB 59.98), chosen by rule best-accuracy" in \
        " ".join(by_accuracy.split())


def test_promote_carries_what_study_best_recommends(quickstart: tuple[Path, str],
                                                    abtune_main: Callable[..., CliResult]) -> None:
    folder, url = quickstart
    base = ["promote", "quickstart", "--storage", url, "--to", str(VIT_TARGET), "--nodes", "2", "--scaling", "local",
            "--dry-run"]
    out = abtune_main(*base, cwd=folder).stdout
    assert out.startswith("promoting trial 2 of study quickstart, chosen by rule within-margin (the default)"), out
    assert "n02-trial-2" in out
    assert "promoting trial 4 of study quickstart, chosen by rule best-accuracy" in \
        abtune_main(*base, "--rule", "best-accuracy").stdout
    refused = abtune_main(*base, "--margin", "-0.1")
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.strip().splitlines() == [
        "abtune: error: --margin must be a top-1 difference in [0, 1), e.g. 0.01 for one point; got -0.1"]
