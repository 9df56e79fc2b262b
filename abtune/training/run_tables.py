"""Tables people read after a run."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from abtune.methods import METHOD_CONFIGS
from abtune.runfiles import RunSummary, summary_path
from abtune.words import plural

MEGA = 1e6


def _mb(value: float) -> str:
    return f"{value / MEGA:,.3f}"


def _ratio(value: float | None) -> str:
    return "n/a (one node)" if value is None else f"{value:.2f}:1"


def traffic_table(summary: RunSummary) -> Table:
    traffic = summary.traffic
    table = Table(title="traffic per rank (MB on the wire, mean over ranks)")
    for column in ("phase", "inter-node", "total"):
        table.add_column(column, justify="right" if column != "phase" else "left")
    for phase, values in traffic["by_phase"].items():
        table.add_row(phase, _mb(values["inter"]["mean"]), _mb(values["total"]["mean"]))
    table.add_row("[bold]all[/]", _mb(traffic["inter_node_bytes"]["mean"]), _mb(traffic["total_bytes"]["mean"]))
    return table


def result_table(summary: RunSummary) -> Table:
    table = Table(title=f"{summary.name}: {summary.method} on {plural(summary.world_size, 'rank')} / {plural(summary.num_nodes, 'node')}")
    table.add_column("measure")
    table.add_column("value", justify="right")
    ecr = summary.ecr_percent
    rows = [
        ("final top-1", f"{summary.final_top1:.4f}"),
        ("best top-1", f"{summary.best_top1:.4f}"),
        ("final val loss", f"{summary.final_loss:.4f}"),
        ("compression (trained model)", f"{summary.compression:.2f}:1"),
        ("compression (trainable params)", f"{summary.trainable_compression:.2f}:1"),
        ("ECR (equation 4)", "n/a" if ecr is None else f"{ecr:.2f}%"),
        ("dense : final params", f"{summary.dense_over_final_params:.2f}:1"),
        ("training MB / rank", _mb(summary.training_bytes)),
        ("DDP training reference MB / rank", _mb(summary.ddp_reference_bytes)),
        ("reduction vs DDP", f"{summary.reduction_vs_ddp:.2f}:1"),
        ("training inter-node MB / rank", _mb(summary.training_inter_node_bytes)),
        ("DDP training inter-node reference MB / rank", _mb(summary.ddp_reference_inter_node_bytes)),
        ("inter-node reduction vs DDP", _ratio(summary.inter_node_reduction_vs_ddp)),
        ("other phases MB / rank", _mb(summary.non_training_bytes)),
        ("training inter-node GB/s / rank", f"{summary.training_inter_node_gb_per_s:.4f}"),
        ("seconds / step", f"{summary.seconds_per_step:.4f}"),
    ]
    if held := summary.held_bytes_by_phase:
        rows.append(("MB held by rank 0 (weights, grads, optimizer)",
                     ", ".join(f"{phase} {_mb(bytes_['total'])}" for phase, bytes_ in held.items())))
    raw = summary.raw
    if raw.get("compression_during_ab"):
        rows.insert(4, ("compression (each AB phase)", ", ".join(f"{c:.2f}" for c in raw["compression_during_ab"][:6])))
    settings = METHOD_CONFIGS[summary.method]
    if summary.decompositions:
        rows.insert(4, ("factored at first decomposition", settings.decomposition_text(summary.decompositions[0])))
    if "schedule" in raw:
        rows.insert(0, ("schedule (steps)", settings.schedule_text(raw["schedule"])))
    rows += _time_and_link_rows(summary)
    for name, value in rows:
        table.add_row(name, value)
    return table


def _time_and_link_rows(summary: RunSummary) -> list[tuple[str, str]]:
    """Time to target when one was set; on the emulated interconnect, what the links carried."""
    rows = [("train seconds", f"{summary.train_seconds:.1f}")]
    target = summary.target_top1
    if target is not None:
        seconds = summary.time_to_target_seconds
        rows.append((f"seconds to top-1 >= {target}", "not reached" if seconds is None else f"{seconds:.1f}"))
    predicted = summary.raw.get("predicted")
    if predicted is not None:
        source = predicted.get("compute_source")
        rows.append((f"predicted train seconds on {predicted['cluster']}",
                     f"{predicted['train_seconds']:.4g}" + (f" ({source} compute)" if source else "")))
    measured = summary.measured_inter_node_bytes
    if measured is not None:
        rows += [("link MB, measured (all nodes)", _mb(measured["total"])),
                 ("inter-node MB, model (all ranks)", _mb(measured["modelled"]))]
        if measured["payload_vs_modelled"] is not None:
            rows.append(("link payload / model", f"{measured['payload_vs_modelled']:.3f}"))
    return rows


def print_summary(summary: RunSummary, run_dir: Path) -> None:
    console = Console(highlight=False)
    console.print(result_table(summary))
    console.print(traffic_table(summary))
    for note in summary.raw.get("predicted", {}).get("notes", []):
        console.print(f"note: {note}")
    console.print(f"summary: {summary_path(run_dir)}")
