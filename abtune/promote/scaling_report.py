"""`abtune report scaling`: the paper's Table 1 for a campaign, per-run results and figures.

Reads each run's summary.json (MLflow later, through the tracking adapter). Inter-node GB/s is the
mean over ranks of the inter-node bytes a rank sent, divided by the training seconds (the paper's
"average interconnect traffic on each process"); on a single node it is 0.
"""

from __future__ import annotations

import csv
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from abtune.promote.campaign import read_campaign, read_outcome
from abtune.promote.plan import BASELINE, Campaign, PlannedRun
from abtune.runfiles import find_summary

MEGA = 1e6
MARKDOWN_FILE, CSV_FILE, PLOT_FILE = "scaling.md", "scaling.csv", "scaling.png"


@dataclass(frozen=True)
class ScalingRow:
    strategy: str
    nodes: int
    run: str
    configuration: str
    method: str
    world_size: int
    local_batch_size: int
    global_batch_size: int
    steps: int
    status: str
    best_top1: float | None = None
    final_top1: float | None = None
    inter_node_gb_per_s: float | None = None
    inter_node_mb: float | None = None
    compression: float | None = None
    reduction_vs_ddp: float | None = None
    promoted_from: str = ""
    reason: str = ""


def collect_rows(campaign_dirs: list[Path]) -> list[ScalingRow]:
    rows: list[ScalingRow] = []
    for campaign_dir in campaign_dirs:
        campaign = read_campaign(campaign_dir)
        rows.extend(row_for(campaign, run, campaign_dir / run.run_dir) for run in campaign.runs)
    return rows


def row_for(campaign: Campaign, run: PlannedRun, run_dir: Path) -> ScalingRow:
    source = "" if run.promoted_from is None else f"{run.promoted_from.study} #{run.promoted_from.trial}"
    base: dict[str, Any] = dict(strategy=campaign.strategy, nodes=run.nodes, run=run.name,
                                configuration=run.configuration, method=run.method, world_size=run.world_size,
                                local_batch_size=run.local_batch_size, global_batch_size=run.global_batch_size,
                                steps=run.steps, promoted_from=source)
    summary = find_summary(run_dir)
    if summary is None:
        outcome = read_outcome(run_dir)
        status = "not run" if outcome is None else "failed"
        return ScalingRow(status=status, reason="" if outcome is None else outcome.reason or "", **base)
    return ScalingRow(status="ok", best_top1=summary.best_top1, final_top1=summary.final_top1,
                      inter_node_gb_per_s=summary.training_inter_node_gb_per_s,
                      inter_node_mb=summary.training_inter_node_bytes / MEGA,
                      compression=summary.method_ratio, reduction_vs_ddp=summary.reduction_vs_ddp, **base)


def table1_markdown(rows: list[ScalingRow]) -> str:
    """Average inter-node GB/s per process: baseline vs each AB configuration, per strategy and node count."""
    configurations = list(dict.fromkeys(r.configuration for r in rows if r.configuration != BASELINE))
    header = ["strategy", "nodes", "baseline (ddp)", *configurations]
    lines = [_md_row(header), _md_row(["---"] * len(header))]
    for strategy, nodes in dict.fromkeys((r.strategy, r.nodes) for r in rows):
        by_config = {r.configuration: r for r in rows if (r.strategy, r.nodes) == (strategy, nodes)}
        cells = [_gbs(by_config.get(c)) for c in (BASELINE, *configurations)]
        lines.append(_md_row([f"constant {strategy} batch", str(nodes), *cells]))
    return "\n".join(lines)


def runs_markdown(rows: list[ScalingRow]) -> str:
    header = ["run", "strategy", "nodes", "ranks", "global batch", "steps", "method", "best top-1", "final top-1",
              "training inter-node GB/s", "training inter-node MB/rank", "compression", "traffic reduction vs ddp", "promoted from",
              "status"]
    lines = [_md_row(header), _md_row(["---"] * len(header))]
    for r in rows:
        lines.append(_md_row([r.run, r.strategy, str(r.nodes), str(r.world_size), str(r.global_batch_size),
                              str(r.steps), r.method, _num(r.best_top1, 4), _num(r.final_top1, 4),
                              _num(r.inter_node_gb_per_s, 6), _num(r.inter_node_mb, 3), _ratio(r.compression),
                              _ratio(r.reduction_vs_ddp), r.promoted_from or "baseline",
                              r.status + (f": {r.reason}" if r.reason else "")]))
    return "\n".join(lines)


def write_report(rows: list[ScalingRow], out_dir: Path) -> list[Path]:
    markdown = (f"## Average inter-node traffic per process (GB/s), as in the paper's Table 1\n\n"
                f"{table1_markdown(rows)}\n\n## Runs\n\n{runs_markdown(rows)}\n")
    (out_dir / MARKDOWN_FILE).write_text(markdown)
    with (out_dir / CSV_FILE).open("w", newline="") as stream:
        writer = csv.DictWriter(stream, fieldnames=list(asdict(rows[0])))
        writer.writeheader()
        writer.writerows(asdict(r) for r in rows)
    plot_scaling(rows, out_dir / PLOT_FILE)
    return [out_dir / MARKDOWN_FILE, out_dir / CSV_FILE, out_dir / PLOT_FILE]


def plot_scaling(rows: list[ScalingRow], path: Path) -> None:
    """Best top-1 and inter-node GB/s against nodes; one column per strategy, one line per configuration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    strategies = list(dict.fromkeys(r.strategy for r in rows))
    figure, axes = plt.subplots(2, len(strategies), figsize=(5.5 * len(strategies), 7), squeeze=False)
    for column, strategy in enumerate(strategies):
        for configuration in dict.fromkeys(r.configuration for r in rows):
            done = sorted((r for r in rows if r.strategy == strategy and r.configuration == configuration
                           and r.status == "ok"), key=lambda r: r.nodes)
            nodes = [r.nodes for r in done]
            axes[0][column].plot(nodes, [r.best_top1 for r in done], marker="o", label=configuration)
            axes[1][column].plot(nodes, [r.inter_node_gb_per_s for r in done], marker="o", label=configuration)
        axes[0][column].set_title(f"constant {strategy} batch")
        axes[0][column].set_ylabel("best validation top-1")
        axes[1][column].set_ylabel("inter-node GB/s per process")
        ticks = sorted({r.nodes for r in rows if r.strategy == strategy})
        for row in (0, 1):
            axes[row][column].set_xscale("log", base=2)
            axes[row][column].set_xticks(ticks, [str(t) for t in ticks])
            axes[row][column].set_xlabel("nodes")
            axes[row][column].grid(True, alpha=0.3)
            axes[row][column].legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def _md_row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _gbs(row: ScalingRow | None) -> str:
    if row is None:
        return "-"
    return _num(row.inter_node_gb_per_s, 6) if row.status == "ok" else row.status


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}:1"
