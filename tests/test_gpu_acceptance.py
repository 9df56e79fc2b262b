"""The GPU acceptance script (benchmarks/gpu_acceptance.py): its CPU path end to end, and its refusals.

The CPU path is the same code a GPU runs (abtune's Trainer on ranks the script starts, the calibration,
timing.py's predictions), on tiny models under gloo: what passes here leaves only the GPU's own parts
(NCCL, CUDA kernels, memory) to the GPU run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from abtune.timing import Cluster
from tests.bench_helpers import BENCHMARKS, load_benchmark

SCRIPT = BENCHMARKS / "gpu_acceptance.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("gpu_acceptance")


def report_json(path: Path) -> dict:
    text = path.read_text()
    return json.loads(text[text.rindex("```json") + len("```json"):text.rindex("```")])


@pytest.mark.slow
def test_cpu_path_trains_every_method_calibrates_and_predicts(tmp_path: Path, bench: ModuleType,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """The script's main in this process (torch imported once); its ranks run the script as a program."""
    out = tmp_path / "report.md"
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--device", "cpu", "--quick", "--out", str(out)])
    with pytest.raises(SystemExit) as exit_:
        bench.main()
    shown = capsys.readouterr()
    assert exit_.value.code == 0, shown.out[-2000:] + shown.err[-2000:]
    report = report_json(out)
    cells = {cell["method"]: cell for cell in report["methods"]}
    assert set(cells) == {"ddp", "ab", "ab-nogroups", "sbc", "powersgd", "fp16"}
    assert all(cell["ok"] and cell["world"] == 2 and cell["backend"] == "gloo" for cell in cells.values())
    ab = cells["ab"]
    assert ab["phase_order"].count("ab") >= 2 and "rebound" in ab["phase_order"] and ab["decompositions"] >= 2
    assert ab["factored_weights"] > 0 and cells["ab-nogroups"]["factored_weights"] > 0  # the factored layers ran
    assert "sync" in ab["traffic_phases"]
    assert {row["model"] for row in report["models"]} == {"vit (tiny)", "small_cnn"}
    assert all(row[phase]["ms_per_step"] > 0 for row in report["models"] for phase in ("dense", "ab"))
    assert all(row["ab"]["params"] < row["dense"]["params"] for row in report["models"])
    Cluster.model_validate(report["calibration"])  # the measured description loads as timing.py's
    assert report["calibration"]["compute"]["measured"][0]["arch"] == "vit"
    vit = next(p for p in report["predictions"] if p["model"] == "vit (tiny)")
    assert vit["predicted"]["calibrated here"]["images_per_s"] > 0
    assert "# GPU acceptance" in out.read_text() and "| ab | fp32 | gloo | 2 | passed |" in out.read_text()


def test_cuda_asked_for_without_one_says_so_in_one_line(bench: ModuleType, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """The script's main in this process (as the CPU-path test runs it)."""
    pytest.importorskip("torch")
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    monkeypatch.setattr(sys, "argv", [str(SCRIPT)])
    with pytest.raises(SystemExit) as exit_:
        bench.main()
    stderr = capsys.readouterr().err
    assert exit_.value.code == 2
    assert stderr.strip().count("\n") == 0 and "no CUDA GPU" in stderr
    assert "Traceback" not in stderr


def test_a_cell_that_finished_but_did_not_cycle_ab_is_a_failure(bench: ModuleType) -> None:
    cycled = {"steps_done": bench.STEPS, "phase_order": ["warmup", "ab", "rebound", "ab", "rebound"],
              "decompositions": 2, "factored_weights": 4, "traffic_phases": ["ab", "sync", "warmup"]}
    assert bench.check_cell("ab", 2, cycled) == []
    assert bench.check_cell("ab-nogroups", 1, {**cycled, "factored_weights": 0}) == [
        "AB factored no weight at any decomposition"]
    assert bench.check_cell("ab", 2, {**cycled, "traffic_phases": ["ab"]}) == ["no sync traffic between AB's groups"]
    assert bench.check_cell("ab", 1, {**cycled, "traffic_phases": ["ab"]}) == []  # one rank: a sync sends nothing
    flat = {**cycled, "phase_order": ["warmup", "ab"]}
    assert "did not cycle" in bench.check_cell("ab-nogroups", 2, flat)[0]
    assert bench.check_cell("ddp", 2, {**cycled, "steps_done": 3}) == [f"trained 3 of {bench.STEPS} steps"]


def test_the_layouts_cover_every_method_and_precision_on_nccl_alone_and_gloo_ranks(bench: ModuleType) -> None:
    full = bench.layouts("cuda", quick=False)
    assert [(lay["backend"], lay["world"]) for lay in full] == [("nccl", 1), ("gloo", 2), ("gloo", 4)]
    cells = set(full[1]["cells"])
    assert len(cells) == 12  # 6 methods x fp32, bf16
    assert set(full[0]["cells"]) == {c for c in cells if c[0] != "ab"}  # one rank has no A and B groups
    assert {p for _, p in cells} == {"fp32", "bf16"} and full[2]["cells"] == [("ab", "fp32"), ("ab", "bf16")]
    assert full[2]["per_node"] == 2  # 2 nodes of 2: AB's groups of two ranks
