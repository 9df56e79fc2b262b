"""`abtune compare --cluster` says where each method's predicted time meets ddp's, for every method that ran
beside ddp, not for ab alone (abtune/compare.py `break_even_lines`)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from abtune import compare, timing
from abtune.compare import ComparisonRow, break_even_lines
from abtune.timing import ComputeSource, Prediction, load_cluster

CLUSTER = load_cluster("paper-a100-hdr200")
# predicted training seconds at an inter-node rate (Gbit/s): compute plus what crosses the link
SECONDS = {"ddp": lambda rate: 10 + 1000 / rate, "ab": lambda rate: 20 + 100 / rate, "sbc": lambda rate: 40 + 1 / rate}


@pytest.fixture(autouse=True)
def stand_in_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    def predict(summary: dict[str, Any], cluster: timing.Cluster) -> Prediction:
        seconds = SECONDS[summary["method"]](cluster.inter_node.gbit_per_s)
        return Prediction(cluster.name, {}, {}, 0.0, seconds, None, ComputeSource("measured", "test"), 0.0)
    monkeypatch.setattr(timing, "predict", predict)
    monkeypatch.setattr(compare, "predict", predict)
    monkeypatch.setattr(compare, "read_summary", lambda folder: SimpleNamespace(raw={"method": Path(folder).name}))


def test_each_method_that_ran_beside_ddp_gets_its_own_break_even_line(tmp_path: Path) -> None:
    rows = [ComparisonRow(method="ddp"), ComparisonRow(method="ab"), ComparisonRow(method="sbc"),
            ComparisonRow(method="fp16", error="failed")]
    lines = break_even_lines(tmp_path, rows, CLUSTER)
    assert len(lines) == 2
    assert "ab's predicted training time equals ddp's at" in lines[0]
    assert "sbc's predicted training time equals ddp's at" in lines[1]
    assert all("fp16" not in line for line in lines)  # it failed: nothing to predict


def test_without_ddp_there_is_nothing_to_break_even_with(tmp_path: Path) -> None:
    assert break_even_lines(tmp_path, [ComparisonRow(method="ab"), ComparisonRow(method="sbc")], CLUSTER) == []
