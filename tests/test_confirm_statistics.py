"""`abtune study confirm`'s statistics know their sample: top-1 intervals within [0, 1], no interval or
significance mark from two seeds or from zero variance, a verdict in words with the seeds a margin needs."""

from __future__ import annotations

import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from optuna.trial import create_trial

from abtune.attrs import DDP
from abtune.study import confirm, stats

TRAFFIC = 28.08e6  # bytes, the same every seed


def test_a_top1_interval_is_wilson_over_the_images_widened_by_three_seeds_and_within_0_1() -> None:
    # Wilson, z = 1.959964, p = 0.97 over 720 images: centre (0.97 + z^2/1440) / (1 + z^2/720) = 0.967571,
    # half z / (1 + z^2/720) * sqrt(0.97 * 0.03 / 720 + z^2 / (4 * 720^2)) = 0.012674
    low, high = stats.wilson(0.97, 720)
    assert (low, high) == (pytest.approx(0.954831, abs=1e-6), pytest.approx(0.980181, abs=1e-6))
    assert stats.interval([0.95, 0.99], 360) == (low, high)  # two seeds: the images alone
    assert all(math.isnan(x) for x in stats.interval([0.95, 0.99]))  # and nothing without them
    three = stats.interval([0.95, 0.99, 0.99], 360)  # the t-interval reaches past 1.0: bounded
    assert three[1] == 1.0 and 0.0 < three[0] < stats.spread([0.95, 0.99, 0.99]).low + 1e-12
    assert all(math.isnan(x) for x in stats.interval([28.0, 28.0, 28.0]))  # zero spread: no interval


def test_significance_needs_three_seeds_and_a_spread() -> None:
    assert not stats.paired([0.99, 0.98], [0.90, 0.91]).significant  # one degree of freedom
    assert stats.paired([0.99, 0.98], [0.90, 0.91]).verdict(maximize=True) == stats.CANNOT_TELL
    three = stats.paired([0.99, 0.98, 0.985], [0.90, 0.91, 0.905])
    assert three.significant and three.verdict(maximize=True) == stats.BETTER
    assert three.verdict(maximize=False) == stats.WORSE
    # differences 0.01 and 0.04: std 0.021213; (1.959964 + 0.841621)^2 * 0.021213^2 / 0.01^2 = 35.3 -> 36 seeds
    assert stats.seeds_to_resolve([0.95, 0.99], [0.94, 0.95], 0.01) == 36
    assert stats.seeds_to_resolve([0.95, 0.99], [0.94, 0.98], 0.01) is None  # no spread to go by


def _record(top1: list[float], ddp_top1: list[float], roles: list[str]) -> dict:
    trial = create_trial(value=top1[0], user_attrs={"reference": DDP} if DDP in roles else {})
    subject = confirm.Subject(trial, roles)
    values = {"top1": top1, "inter_node_bytes": [TRAFFIC] * len(top1), "validation_images": [360.0]}
    references = {DDP: {"top1": ddp_top1, "inter_node_bytes": [4 * TRAFFIC] * len(top1)}}
    spec = SimpleNamespace(objectives=["top1", "inter_node_bytes"])
    return confirm.record(subject, values, references, spec, [1000, 2000], Path("confirm"), 0.01)


def test_confirm_with_two_seeds_prints_no_interval_outside_0_1_and_no_significance_mark(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's case: 2 seeds gave a t-interval [0.8274, 1.0392] and a starred difference from one degree of
    freedom, and [28.08, 28.08] for traffic that is the same every seed."""
    monkeypatch.setenv("COLUMNS", "250")
    candidate = _record([0.95, 0.99], [0.94, 0.95], ["candidate"])
    reference = _record([0.94, 0.95], [0.94, 0.95], [DDP])
    confirm.print_confirmation("quickstart", [candidate, reference])
    out = capsys.readouterr().out
    numbers = [float(x) for x in re.findall(r"\[(\d+\.\d+), (\d+\.\d+)\]", out) for x in x]
    assert numbers and all(0.0 <= x <= 1.0 for x in numbers), out
    assert "*" not in out.replace("* = significant", "")
    assert "28.08, 28.08" not in out and "exact (same every seed)" in out
    flat = " ".join(out.split())
    assert "+0.0250: cannot tell (2 seeds; a test needs 3); about 36 seeds would resolve 0.01" in flat, out
    assert "-84.24: better (same every seed)" in flat  # 28.08 MB against DDP's 112.32: exact, fewer bytes
    stored = candidate["versus"][DDP]["top1"]
    assert (stored["significant"], stored["verdict"], stored["seeds_needed"]) == (False, stats.CANNOT_TELL, 36)
    assert (candidate["metrics"]["top1"]["low"], candidate["metrics"]["top1"]["high"]) == stats.wilson(0.97, 720)


def test_a_difference_below_the_shown_digits_keeps_two_significant_ones_beside_its_verdict() -> None:
    # 1,200 bytes more every seed: worse, exactly; in MB at 2 digits it would read +0.00
    test = stats.paired([TRAFFIC + 1200] * 3, [TRAFFIC] * 3)
    row = {"diff": test.diff, "t": test.t, "p": test.p, "significant": test.significant, "n": test.n,
           "verdict": test.verdict(maximize=False)}
    assert confirm._versus("inter_node_bytes", row, 0.01) == "+0.0012: worse (same every seed)"
    row |= {"diff": 0.0, "verdict": stats.SAME}
    assert confirm._versus("inter_node_bytes", row, 0.01).startswith("+0.00: the same")
    row |= {"diff": 2.5e6}
    assert confirm._versus("inter_node_bytes", row, 0.01).startswith("+2.50: ")
