"""`abtune compare`: one config, several methods, one table (and CSV, JSON, plot)."""

from __future__ import annotations

import csv
import itertools
import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from matplotlib.figure import Figure
from matplotlib.text import Text
from mlflow import MlflowClient

from abtune.compare import (
    ComparisonRow,
    comparison_figure,
    plot_comparison,
    plot_points,
    prediction_lines,
    separation_words,
)
from abtune.runfiles import read_summary
from abtune.timing import load_cluster, predict, separation
from tests.conftest import CliResult, write_config
from tests.terminal import run_in_terminal, tables_in, too_wide

QUICKSTART = Path(__file__).parent.parent / "studies" / "run_quickstart.yaml"
CHANCE = 0.1
MIN_TOP1 = 0.6  # after 150 steps (sbc: 15 exchanges); chance is 0.1
STEPS = 150
SBC_MIN_REDUCTION = 1000  # delay 10, 1% of entries: the bar (the paper reports x3531 on ResNet-50)
PNG_MAGIC = b"\x89PNG"


@pytest.mark.slow
def test_compare_runs_every_method_on_the_same_budget(tmp_path: Path, abtune_main: Callable[..., CliResult]) -> None:
    """In this process (the installed command, and MLflow: the terminal test below), on 2 ranks as 2 nodes: what
    the table holds does not depend on the layout, and 4 ranks would train twice the samples for it."""
    out = tmp_path / "cmp"
    result = abtune_main("compare", str(QUICKSTART), "--methods", "ddp,ab,sbc,powersgd,fp16", "--nproc", "2",
                         "--ranks-per-node", "1", "--out", str(out), "--set", f"train.steps={STEPS}",
                         "--set", "sbc.delay=10", "--set", "sbc.sparsity=0.01", "--set", "train.target_top1=0.5",
                         "--cluster", "ethernet-25g", "--no-tracking")
    assert result.returncode == 0, result.stderr
    assert "methods compared" in result.stdout and "ECR" in result.stdout
    rows = {r["method"]: r for r in csv.DictReader((out / "compare.csv").open())}
    assert list(rows) == ["ddp", "ab", "sbc", "powersgd", "fp16"]
    assert json.loads((out / "compare.json").read_text())[2]["method"] == "sbc"
    assert (out / "compare.png").read_bytes()[:4] == PNG_MAGIC
    for method, row in rows.items():
        assert float(row["final_top1"]) > MIN_TOP1 > CHANCE, method
        summary = read_summary(out / method).raw
        assert summary["steps_done"] == STEPS and summary["config"]["seed"] == 0
        assert float(row["training_mb"]) == pytest.approx(summary["traffic"]["training_bytes"] / 1e6)
    assert float(rows["ddp"]["reduction_vs_ddp"]) == 1.0
    # AB: the trained model's compression, its ECR, and training inter-node bytes against ddp's.
    ab, ddp = (read_summary(out / m).raw for m in ("ab", "ddp"))
    ratio = ab["compression"]["trained_model_ratio"]
    assert float(rows["ab"]["compression"]) == pytest.approx(ratio)
    assert float(rows["ab"]["ecr_percent"]) == pytest.approx(75.0 * (1 - 1 / ratio))
    assert float(rows["ab"]["training_inter_node_mb"]) == pytest.approx(ab["traffic"]["training_inter_node_bytes"] / 1e6)
    assert float(rows["ab"]["ddp_training_inter_node_mb"]) == pytest.approx(ddp["traffic"]["training_inter_node_bytes"] / 1e6)
    assert rows["ddp"]["ecr_percent"] == ""  # ddp does not compress the model
    assert float(rows["sbc"]["reduction_vs_ddp"]) >= SBC_MIN_REDUCTION
    assert float(rows["fp16"]["reduction_vs_ddp"]) == pytest.approx(2.0, rel=1e-3)
    assert 1.0 < float(rows["powersgd"]["reduction_vs_ddp"]) < float(rows["sbc"]["reduction_vs_ddp"])
    # --cluster: each method's predicted time on the named cluster, and where ab's equals ddp's
    cluster = load_cluster("ethernet-25g")
    for method, row in rows.items():
        predicted = predict(read_summary(out / method).raw, cluster)
        assert float(row["predicted_train_seconds"]) == pytest.approx(predicted.train_seconds)
        assert row["predicted_time_to_target_seconds"] == str(predicted.time_to_target_seconds)
    # where that compute comes from: the fp32 ViT has no measured or published row there, so it is assumed
    assert {row["predicted_compute_source"] for row in rows.values()} == {"assumed"}
    assert "note: compute on ethernet-25g is not measured (assumed)" in result.stdout, result.stdout
    assert re.search(r"on ethernet-25g (\(25 Gbit/s\) )?with assumed compute", result.stdout), result.stdout
    # a faster method or a break-even only where the gap exceeds the model's uncertainty (assumed compute: 50%)
    assert separation_words(cluster, "with assumed compute", separation(ab, ddp, cluster), "ab") in result.stdout


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--methods", "ddp,sparse"], "--methods: unknown sparse"),
        (["--methods", "ddp,ddp"], "lists a method twice"),
        (["--methods", "ddp", "--set", "sbc.delay=3"], "--set sbc.delay: sbc is not among --methods"),
        (["--methods", "ddp,sbc", "--set", "sbc.delay=0"], "method.delay: Input should be greater than or equal to 1"),
        (["--launcher", "debug"], "--launcher debug: compare runs on local profiles (local, emulated)"),
    ],
)
def test_compare_rejects_bad_requests_before_training(tmp_path: Path, abtune_main: Callable[..., CliResult],
                                                      args: list[str], expected: str) -> None:
    config = write_config(tmp_path / "run.yaml")
    result = abtune_main("compare", str(config), "--nproc", "2", "--out", str(tmp_path / "out"), *args)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and expected in result.stderr, result.stderr
    assert not (tmp_path / "out").exists()


def test_the_plot_puts_inter_node_traffic_on_x_and_labels_compression(tmp_path: Path) -> None:
    """AB's in-node group traffic hides its saving in training MB (109.9 vs 128.2 here); the inter-node MB a
    study optimizes show it (28.4 vs 64.1)."""
    rows = [ComparisonRow("ddp", final_top1=0.96, training_mb=128.2, training_inter_node_mb=64.1, compression=1.0),
            ComparisonRow("ab", final_top1=0.95, training_mb=109.9, training_inter_node_mb=28.4, compression=2.85),
            ComparisonRow("sbc", error="rank 1 died")]
    label, points = plot_points(rows)
    assert label.startswith("training inter-node traffic per rank")
    assert [(p.method, p.x_mb, p.label) for p in points] == [("ddp", 64.1, "ddp"), ("ab", 28.4, "ab 2.9:1")]
    drawn = plot_comparison(rows, tmp_path / "compare.png")  # the points as read back from the figure
    assert [(p.method, p.x_mb, p.top1, p.label) for p in drawn] == [("ddp", 64.1, 0.96, "ddp"),
                                                                    ("ab", 28.4, 0.95, "ab 2.9:1")]
    assert (tmp_path / "compare.png").read_bytes()[:4] == PNG_MAGIC


def _traffic_tick_labels(figure: Figure) -> list[Text]:
    """The traffic axis's tick labels as drawn: in view, visible, with text."""
    axis = figure.axes[0].xaxis
    low, high = sorted(axis.get_view_interval())
    ticks = [t for t in (*axis.get_major_ticks(), *axis.get_minor_ticks())
             if low <= t.get_loc() <= high and t.label1.get_visible() and t.label1.get_text()]
    return [t.label1 for t in sorted(ticks, key=lambda t: t.get_loc())]


# Traffic within a decade (matplotlib then labels minor ticks too, 1.225x10^0 wide), within two, and spans
# that cross one decade boundary only (a lone `10` would give no scale).
@pytest.mark.parametrize(("low_mb", "high_mb"), [(1.2, 1.35), (30.0, 33.0), (15.0, 25.0), (0.0017, 0.00186),
                                                 (3.0, 40.0), (1783.0, 26740.0), (7.0, 16.0), (28.4, 64.1)])
def test_the_traffic_axis_labels_are_plain_numbers_that_do_not_overlap(tmp_path: Path, low_mb: float,
                                                                      high_mb: float) -> None:
    import matplotlib.pyplot as plt

    rows = [ComparisonRow("ddp", final_top1=0.95, training_mb=high_mb, training_inter_node_mb=high_mb),
            ComparisonRow("ab", final_top1=0.94, training_mb=low_mb, training_inter_node_mb=low_mb, compression=2.0)]
    figure, _ = comparison_figure(rows)
    figure.savefig(tmp_path / "compare.png")  # drawn as written
    renderer = figure.canvas.get_renderer()
    labels = _traffic_tick_labels(figure)
    boxes = [label.get_window_extent(renderer) for label in labels]
    texts = [label.get_text() for label in labels]
    plt.close(figure)
    assert len(labels) >= 2, texts
    assert all(left.x1 < right.x0 for left, right in itertools.pairwise(boxes)), texts
    values = [float(text) for text in texts]  # plain MB, not 3x10^1
    assert values == sorted(values) and low_mb / 2 < values[-1] and values[0] < high_mb * 2, texts


def test_on_one_node_the_plot_falls_back_to_training_traffic() -> None:
    rows = [ComparisonRow("ddp", final_top1=0.96, training_mb=128.2, training_inter_node_mb=0.0),
            ComparisonRow("ab", final_top1=0.95, training_mb=109.9, training_inter_node_mb=0.0, compression=2.85)]
    label, points = plot_points(rows)
    assert "one node" in label and [p.x_mb for p in points] == [128.2, 109.9]


def test_prediction_lines_name_where_compute_comes_from_and_each_note_once() -> None:
    """What `compare --cluster` prints under its table: the quickstart's model on the paper's nodes has no
    measured or published rate (fp32 ViT), so its compute is assumed and its steps are mostly the floor."""
    from tests.test_timing import model_run

    paper = load_cluster("paper-a100-hdr200")
    flops = 1_532_544  # the quickstart ViT's forward FLOPs a sample (tests/test_models.py counts them by hand)
    predictions = {m: predict(model_run("vit", flops, precision="fp32", batch=32), paper) for m in ("ddp", "ab")}
    lines = prediction_lines(predictions)
    source = predictions["ddp"].compute_source
    assert lines[0] == f"predicted compute (ddp, ab): assumed: {source.detail}"
    assert source.detail == "20% of 19.5 TFLOP/s (fp32) for 3 x the forward FLOPs a sample"
    assert lines[1].startswith("note: compute on paper-a100-hdr200 is not measured (assumed)")
    assert lines[2].startswith("note: predicted steps on paper-a100-hdr200 are mostly its per-step floor (2 ms, assumed)")
    assert len(lines) == 3  # ab's notes are ddp's: printed once


@pytest.mark.slow
def test_compare_fits_the_terminal_says_what_it_trains_and_is_recorded_in_mlflow(tmp_path: Path, mlflow_db: Path) -> None:
    """In a 100-column terminal with --cluster (whose headers were cut to `inter-n…`, `predict…`): every line of
    the table fits, every essential header is whole, the progress names the method it trains, and MLflow holds
    the comparison as a run with one run per method inside it and the table's files."""
    config = write_config(tmp_path / "run.yaml", train={"steps": 20, "local_batch_size": 16, "eval_every": 10})
    uri = f"sqlite:///{mlflow_db}"
    code, lines = run_in_terminal(["compare", str(config), "--methods", "ddp,ab", "--nproc", "2", "--ranks-per-node",
                                   "1", "--out", str(tmp_path / "out"), "--cluster", "ethernet-25g",
                                   "--tracking-uri", uri], 100, tmp_path)
    assert code == 0, "\n".join(lines)
    assert [line for line in lines if line.startswith("compare: training")] == [
        "compare: training ddp (1 of 2) in out/ddp", "compare: training ab (2 of 2) in out/ab"]  # relative to where it ran
    table = [line for line in lines if line[:1] in "┏┃┡│└"]
    assert table and too_wide(table, 100) == []
    (shown,) = tables_in(lines)
    assert shown.headers[:8] == ["method", "final top-1", "inter-node MB", "inter-node vs ddp", "model compression",
                                 "update compression", "predicted train s", "predicted s to target"]
    assert [row[0] for row in shown.rows] == ["ddp", "ab"]  # one line per method
    assert "…" not in "\n".join(lines)

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("tiny-compare")
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    assert set(runs) == {"out", "ddp", "ab"}
    group = runs["out"]
    assert group.data.tags["abtune.role"] == "compare" and group.info.status == "FINISHED"
    assert {a.path for a in client.list_artifacts(group.info.run_id)} == {"compare.csv", "compare.json", "compare.png"}
    rows = {r["method"]: r for r in csv.DictReader((tmp_path / "out" / "compare.csv").open())}
    for method in ("ddp", "ab"):
        run = runs[method]
        assert run.data.tags["mlflow.parentRunId"] == group.info.run_id and run.info.status == "FINISHED"
        assert run.data.params["method"] == method
        assert run.data.metrics["final_top1"] == pytest.approx(float(rows[method]["final_top1"]))
