"""`abtune compare`: the same run config trained with several methods, side by side.

Every method gets the same seed, data, model, optimizer and step budget; only the `method`
section changes. A method keeps the run config's own method section when the names match, and
`--set METHOD.key=value` sets a field of one method only (e.g. `--set sbc.delay=20`).

Traffic columns are training traffic (the phases that exchange gradients, updates or factors),
set against DDP's training traffic: the ddp run of the same comparison when there is one, else
DDP's formula. The initial weight broadcast, evaluations, checkpoints and the report's gather are
counted apart ("other MB"). Compression is the AB paper's: of the model being trained (AB: at the
end of its last AB phase); ECR is its equation 4 (F = 25%, L = 75%) from that compression.
"""

from __future__ import annotations

import csv
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from abtune import prose, tables
from abtune.config import RunConfig, apply_overrides, parse_run_config
from abtune.errors import AbtuneError, ConfigError
from abtune.methods import METHOD_NAMES
from abtune.objectives import pareto_mask
from abtune.runfiles import RunSummary, read_summary
from abtune.timing import RATE_GRID, Cluster, Prediction, Separation, predict, separation

MEGA = 1e6
CSV_FILE, JSON_FILE, PLOT_FILE = "compare.csv", "compare.json", "compare.png"
PLOT_DPI = 120
LABEL_GAP_PX = 4  # between two tick labels of compare.png's traffic axis


UPDATE_COMPRESSING = ("sbc", "powersgd", "fp16")  # their method_ratio is the update's compression


@dataclass(frozen=True)
class ComparisonRow:
    method: str
    final_top1: float | None = None
    best_top1: float | None = None
    val_loss: float | None = None
    training_mb: float | None = None
    training_inter_node_mb: float | None = None
    ddp_training_inter_node_mb: float | None = None
    reduction_vs_ddp: float | None = None
    inter_node_reduction_vs_ddp: float | None = None
    other_mb: float | None = None
    compression: float | None = None
    ecr_percent: float | None = None
    method_ratio: float | None = None  # the method's own figure (update compression for sbc, powersgd, fp16)
    wall_seconds: float | None = None
    train_seconds: float | None = None
    measured_inter_node_mb: float | None = None  # what the emulated links carried (all nodes), headers included
    predicted_train_seconds: float | None = None  # on --cluster (abtune/timing.py)
    predicted_time_to_target_seconds: float | None = None
    predicted_compute_source: str | None = None  # measured, published, scaled or assumed (abtune/timing.py)
    error: str | None = None


def parse_methods(text: str) -> list[str]:
    methods = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHOD_NAMES]
    if unknown or not methods:
        raise ConfigError(f"--methods: unknown {', '.join(unknown) or '(none given)'}; "
                          f"choose from {', '.join(METHOD_NAMES)}")
    if len(set(methods)) != len(methods):
        raise ConfigError(f"--methods lists a method twice: {text}")
    return methods


def split_overrides(overrides: dict[str, Any], methods: list[str]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """Shared overrides, and per method the `METHOD.key` ones (as `method.key`)."""
    shared: dict[str, Any] = {}
    per_method: dict[str, dict[str, Any]] = {m: {} for m in methods}
    for key, value in overrides.items():
        head, _, rest = key.partition(".")
        if head in per_method and rest:
            per_method[head][f"method.{rest}"] = value
        elif head in METHOD_NAMES:
            raise ConfigError(f"--set {key}: {head} is not among --methods")
        else:
            shared[key] = value
    return shared, per_method


def method_config(base: RunConfig, method: str, overrides: dict[str, Any]) -> RunConfig:
    data = base.model_dump(mode="json")
    if data["method"]["name"] != method:
        data["method"] = {"name": method}
    data["name"] = f"{base.name}-compare"
    return parse_run_config(apply_overrides(data, overrides), source=f"method {method}")


def _ratio(reference: float, value: float) -> float | None:
    if not reference:
        return None  # e.g. no inter-node traffic at all on one node
    return reference / value if value else float("inf")


def row_from_summary(method: str, summary: RunSummary, wall_seconds: float,
                     ddp: RunSummary | None, cluster: Cluster | None = None) -> ComparisonRow:
    """Reductions against the measured ddp run when there is one, else against DDP's formula."""
    training, inter = summary.training_bytes, summary.training_inter_node_bytes
    if ddp is not None:
        reference, inter_reference = ddp.training_bytes, ddp.training_inter_node_bytes
    else:
        reference, inter_reference = summary.ddp_reference_bytes, summary.ddp_reference_inter_node_bytes
    return ComparisonRow(
        method=method, final_top1=summary.final_top1, best_top1=summary.best_top1,
        val_loss=summary.final_loss, training_mb=training / MEGA, training_inter_node_mb=inter / MEGA,
        ddp_training_inter_node_mb=inter_reference / MEGA, reduction_vs_ddp=_ratio(reference, training),
        inter_node_reduction_vs_ddp=_ratio(inter_reference, inter),
        other_mb=summary.non_training_bytes / MEGA,
        compression=summary.compression, ecr_percent=summary.ecr_percent,
        method_ratio=summary.method_ratio, wall_seconds=wall_seconds,
        train_seconds=summary.train_seconds, measured_inter_node_mb=_measured_mb(summary),
        **_predicted(summary, cluster),
    )


def _predicted(summary: RunSummary, cluster: Cluster | None) -> dict[str, Any]:
    if cluster is None:
        return {}
    prediction = predict(summary.raw, cluster)
    return {"predicted_train_seconds": prediction.train_seconds,
            "predicted_time_to_target_seconds": prediction.time_to_target_seconds,
            "predicted_compute_source": prediction.compute_source.kind}


def finished_predictions(out_dir: Path, rows: list[ComparisonRow], cluster: Cluster) -> dict[str, Prediction]:
    return {r.method: predict(read_summary(out_dir / r.method).raw, cluster) for r in rows if r.error is None}


def prediction_lines(predictions: dict[str, Prediction]) -> list[str]:
    """Where the predictions' compute comes from (one line per source, naming its methods) and, once each,
    the notes a user must read beside them (compute that is a guess, steps that are mostly the floor)."""
    by_source: dict[str, list[str]] = {}
    for method, prediction in predictions.items():
        by_source.setdefault(str(prediction.compute_source), []).append(method)
    lines = [f"predicted compute ({', '.join(methods)}): {source}" for source, methods in by_source.items()]
    notes = dict.fromkeys(note for prediction in predictions.values() for note in prediction.notes)
    return lines + [f"note: {note}" for note in notes]


def break_even_lines(out_dir: Path, rows: list[ComparisonRow], cluster: Cluster) -> list[str]:
    """For each method that ran beside ddp: where its predicted time on `cluster` equals ddp's, and which
    compute that assumed."""
    done = [r.method for r in rows if r.error is None]
    if "ddp" not in done:
        return []
    ddp = read_summary(out_dir / "ddp").raw
    ddp_at = predict(ddp, cluster)
    lines = []
    for method in (m for m in done if m != "ddp"):
        summary = read_summary(out_dir / method).raw
        kinds = sorted({predict(summary, cluster).compute_source.kind, ddp_at.compute_source.kind})
        lines.append(separation_words(cluster, f"with {' and '.join(kinds)} compute",
                                      separation(summary, ddp, cluster), method))
    return lines


def separation_words(cluster: Cluster, compute: str, seen: Separation, method: str) -> str:
    """A faster method or a break-even only where the gap exceeds the model's uncertainty (timing.UNCERTAINTY)."""
    within = f"within the model's uncertainty (±{seen.uncertainty:.0%})"
    where = f"on {cluster.name} ({cluster.inter_node.gbit_per_s:g} Gbit/s) {compute}"
    if seen.method_faster is None and seen.ddp_faster is None:
        return (f"{where}, {method}'s and ddp's predicted training times are {within} at every inter-node rate from "
                "0.01 to 10,000 Gbit/s: neither is predicted faster, and no break-even is claimed")
    sides = [f"{name} is predicted faster from {low:.3g} to {high:.3g} Gbit/s" for name, span in
             ((method, seen.method_faster), ("ddp", seen.ddp_faster)) if span is not None for low, high in [span]]
    if seen.break_even_gbit is not None and seen.method_faster is not None and seen.ddp_faster is not None:
        return (f"{where}, {method}'s predicted training time equals ddp's at {seen.break_even_gbit:.3g} Gbit/s per "
                f"node: {'; '.join(sides)}; in between they are {within}")
    if (seen.method_faster or seen.ddp_faster) == (RATE_GRID[0], RATE_GRID[-1]):
        faster = method if seen.method_faster else "ddp"
        return f"{where}, {faster} is predicted faster at every inter-node rate from 0.01 to 10,000 Gbit/s"
    return f"{where}, {'; '.join(sides)}; at other rates the two are {within}"


def _measured_mb(summary: RunSummary) -> float | None:
    measured = summary.measured_inter_node_bytes
    return None if measured is None else measured["total"] / MEGA


def run_methods(configs: dict[str, RunConfig], out_dir: Path,
                train: Callable[[RunConfig, Path], None], cluster: Cluster | None = None) -> list[ComparisonRow]:
    """Train each method in OUT/METHOD (`train` raises when the run failed); a failed method becomes a row
    with its error, the others still run."""
    summaries: dict[str, tuple[RunSummary, float]] = {}
    errors: dict[str, str] = {}
    for number, (method, config) in enumerate(configs.items(), start=1):
        run_dir = out_dir / method
        prose.say(f"compare: training {method} ({number} of {len(configs)}) in {prose.shown_path(run_dir)}")
        started = time.perf_counter()
        try:
            train(config, run_dir)
        except AbtuneError as error:
            errors[method] = str(error)
            continue
        summaries[method] = read_summary(run_dir), time.perf_counter() - started
    ddp = summaries["ddp"][0] if "ddp" in summaries else None
    rows = []
    for method in configs:
        if method in errors:
            rows.append(ComparisonRow(method=method, error=errors[method]))
        else:
            summary, wall = summaries[method]
            rows.append(row_from_summary(method, summary, wall, ddp, cluster))
    return rows


def write_outputs(rows: list[ComparisonRow], out_dir: Path) -> list[Path]:
    records = [asdict(r) for r in rows]
    with (out_dir / CSV_FILE).open("w", newline="") as stream:
        writer = csv.DictWriter(stream, fieldnames=list(records[0]))
        writer.writeheader()
        writer.writerows(records)
    (out_dir / JSON_FILE).write_text(json.dumps(records, indent=2))
    plot_comparison(rows, out_dir / PLOT_FILE)
    return [out_dir / CSV_FILE, out_dir / JSON_FILE, out_dir / PLOT_FILE]


@dataclass(frozen=True)
class PlotPoint:
    method: str
    x_mb: float
    top1: float
    label: str  # the method, and its trained-model compression when the model was compressed


def plot_points(rows: list[ComparisonRow]) -> tuple[str, list[PlotPoint]]:
    """The x axis's label and one point per finished method: training inter-node MB per rank (what a study
    optimizes, where AB's saving shows), or training MB when the runs had one node and sent nothing across."""
    done = [r for r in rows if r.error is None and r.final_top1 is not None and r.training_mb]
    across = all(r.training_inter_node_mb for r in done)
    label = ("training inter-node traffic per rank (MB, log scale)" if across
             else "training traffic per rank (MB, log scale; one node: nothing crosses)")
    points = []
    for row in done:
        compressed = row.compression is not None and row.compression > 1.005
        text = f"{row.method} {row.compression:.1f}:1" if compressed else row.method
        x = row.training_inter_node_mb if across else row.training_mb
        points.append(PlotPoint(row.method, float(x), float(row.final_top1), text))  # type: ignore[arg-type]
    return label, points


def plot_comparison(rows: list[ComparisonRow], path: Path) -> list[PlotPoint]:
    """Write compare.png (comparison_figure); return the points as drawn (read back from the figure), so what
    lands on each axis can be checked."""
    import matplotlib.pyplot as plt

    figure, drawn = comparison_figure(rows)
    figure.savefig(path)
    plt.close(figure)
    return drawn


def comparison_figure(rows: list[ComparisonRow]) -> tuple[Any, list[PlotPoint]]:
    """Final top-1 against training inter-node traffic (log scale), each point annotated with its method and,
    when the trained model is compressed, its compression: up and to the left is better."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xlabel, points = plot_points(rows)
    figure, axes = plt.subplots(figsize=(6.5, 4.2), dpi=PLOT_DPI)
    drawn = []
    for index, point in enumerate(points):
        marker = axes.scatter(point.x_mb, point.top1, s=45, label=point.label)
        # Beside the point, alternately above and below: methods at one top-1 often sit close together;
        # the legend (same colours) still tells them apart where two labels touch.
        axes.annotate(point.label, (point.x_mb, point.top1), xytext=(6, 5 if index % 2 == 0 else -11),
                      textcoords="offset points", fontsize="small", color=marker.get_facecolor()[0])
        (x, y), = marker.get_offsets().tolist()
        drawn.append(PlotPoint(point.method, float(x), float(y), point.label))
    axes.set_xscale("log")
    _plain_megabytes(axes.xaxis)
    axes.set_xlabel(xlabel)
    axes.set_ylabel("final validation top-1")
    axes.set_title("accuracy vs inter-node traffic (method, trained-model compression)")
    axes.grid(True, which="both", alpha=0.3)
    if points:
        axes.legend(fontsize="small", loc="best")
        axes.margins(x=0.15, y=0.1)  # room for the labels right of the rightmost point
    figure.tight_layout()
    _readable_tick_labels(figure, axes.xaxis)
    return figure, drawn


def _plain_megabytes(axis: Any, label_every_minor_tick: bool = False) -> None:
    """Tick labels as plain MB (30, 45, 1.25) where matplotlib would write 3x10^1: traffic within a decade
    gets a label on minor ticks too, and the scientific form is too wide for them."""
    from matplotlib.ticker import LogFormatterSciNotation

    class PlainLogFormatter(LogFormatterSciNotation):
        def __call__(self, x: float, pos: int | None = None) -> str:
            return f"{x:g}" if super().__call__(x, pos) else ""

    axis.set_major_formatter(PlainLogFormatter())
    axis.set_minor_formatter(PlainLogFormatter(minor_thresholds=(math.inf, math.inf) if label_every_minor_tick
                                               else (1, 0.4)))  # matplotlib's default choice of minor labels


def _readable_tick_labels(figure: Any, axis: Any) -> None:
    """At least two labels on the traffic axis (a lone `10` gives no scale), none overlapping: each label
    that would touch the one kept before it, left to right, as drawn, is blanked."""
    if len(_labelled_ticks(figure, axis)) < 2:
        _plain_megabytes(axis, label_every_minor_tick=True)
    renderer = figure.canvas.get_renderer()
    kept = None
    for tick in _labelled_ticks(figure, axis):
        box = tick.label1.get_window_extent(renderer)
        if kept is not None and box.x0 < kept.x1 + LABEL_GAP_PX:
            tick.label1.set_visible(False)
        else:
            kept = box


def _labelled_ticks(figure: Any, axis: Any) -> list[Any]:
    """The ticks in view whose label is drawn, left to right (after drawing the figure as it is now)."""
    figure.canvas.draw()
    low, high = sorted(axis.get_view_interval())
    ticks = [t for t in (*axis.get_major_ticks(), *axis.get_minor_ticks())
             if low <= t.get_loc() <= high and t.label1.get_visible() and t.label1.get_text()]
    return sorted(ticks, key=lambda t: t.get_loc())


def print_table(rows: list[ComparisonRow], wide: bool = False) -> None:
    """The comparison within the terminal's width: method, top-1, training inter-node MB and its ratio to
    DDP's, compression (and the predicted times with --cluster) always; the rest while they fit (`wide`:
    all; compare.csv and compare.json hold every column)."""
    measured = any(r.measured_inter_node_mb is not None for r in rows)
    predicted = any(r.predicted_train_seconds is not None for r in rows)
    columns = [tables.Column("method", justify="left"), tables.Column("final top-1"), tables.Column("inter-node MB"),
               tables.Column("inter-node vs ddp"), tables.Column("model compression"),
               tables.Column("update compression", tables.KEY),
               *([tables.Column("predicted train s"), tables.Column("predicted s to target")] if predicted else []),
               tables.Column("reduction vs ddp", tables.KEY), tables.Column("ECR", tables.KEY),
               tables.Column("train s", tables.KEY), *([tables.Column("link MB", tables.KEY)] if measured else []),
               tables.Column("training MB", tables.DETAIL), tables.Column("ddp inter-node MB", tables.DETAIL),
               tables.Column("other MB", tables.DETAIL), tables.Column("val loss", tables.DETAIL),
               tables.Column("wall s", tables.DETAIL)]
    cells = [_cells(r, measured, predicted) if r.error is None else [r.method, "failed", *["-"] * (len(columns) - 2)]
             for r in rows]
    title = ("methods compared (training traffic: MB per rank on the wire, mean over ranks"
             + ("; link MB: all nodes' links, measured)" if measured else ")"))
    out = tables.console()
    tables.print_table(out, title, columns, cells, wide=wide, elsewhere=f"{CSV_FILE} and {JSON_FILE} hold every column")
    for r in rows:
        if r.error is not None:
            out.print(f"{r.method} failed: {r.error}")
    compressing = [r.method for r in rows if _update_ratio(r) is not None and r.error is None]
    if compressing:
        out.print(f"model compression: the trained model's size against the dense one (1.0:1 for a method that "
                  f"trains the full model); update compression: what {', '.join(compressing)} "
                  "compress{} each gradient update by, on the wire".format("" if len(compressing) > 1 else "es"))
    if text := verdict(rows):
        out.print(text)


def verdict(rows: list[ComparisonRow]) -> str | None:
    """One line on final top-1 against training inter-node traffic: which methods another beats on both
    (dominates), and which trade one for the other (the Pareto front of the two); None with under two methods."""
    done = [r for r in rows if r.error is None and r.final_top1 is not None and r.training_inter_node_mb is not None]
    if len(done) < 2:
        return None
    scores = [[r.final_top1, -r.training_inter_node_mb] for r in done]  # type: ignore[operator]
    front = [r for r, on_front in zip(done, pareto_mask(scores), strict=True) if on_front]
    beaten = {}
    for r in done:
        if r not in front:
            winner = max((f for f in front if f.final_top1 >= r.final_top1  # type: ignore[operator]
                          and f.training_inter_node_mb <= r.training_inter_node_mb), key=lambda f: f.final_top1)  # type: ignore[operator]
            beaten.setdefault(winner.method, []).append(r.method)
    parts = [f"{winner} dominates {_listed(losers)} (no lower top-1, no more traffic, better on one)"
             for winner, losers in beaten.items()]
    if len(front) > 1:
        ordered = sorted(front, key=lambda r: -r.final_top1)  # type: ignore[operator]
        parts.append(f"{_listed([r.method for r in ordered])} trade top-1 for traffic (highest top-1 first)")
    else:
        parts.append(f"{front[0].method} is best on both")
    return "verdict: " + "; ".join(parts)


def _listed(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _cells(r: ComparisonRow, measured: bool, predicted: bool) -> list[str]:
    return [r.method, f"{r.final_top1:.4f}", f"{r.training_inter_node_mb:.3f}", _x(r.inter_node_reduction_vs_ddp),
            _x(r.compression), "-" if (ratio := _update_ratio(r)) is None else _x(ratio),
            *([_seconds(r.predicted_train_seconds), _seconds(r.predicted_time_to_target_seconds)] if predicted else []),
            _x(r.reduction_vs_ddp), "-" if r.ecr_percent is None else f"{r.ecr_percent:.2f}%", f"{r.train_seconds:.1f}",
            *([_mb(r.measured_inter_node_mb)] if measured else []), f"{r.training_mb:.3f}",
            f"{r.ddp_training_inter_node_mb:.3f}", f"{r.other_mb:.3f}", f"{r.val_loss:.4f}", f"{r.wall_seconds:.1f}"]


def _update_ratio(r: ComparisonRow) -> float | None:
    """What a method compresses each gradient update by (its own figure); None for ddp and ab, which send
    their gradients whole (ab's own figure is its model's compression)."""
    return r.method_ratio if r.method in UPDATE_COMPRESSING else None


def _mb(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return "never" if value == float("inf") else f"{value:.4g}"


def _x(ratio: float | None) -> str:
    return "n/a" if ratio is None else f"{ratio:,.1f}:1"
