"""A campaign's GPU-hours before it starts, on a cluster description (abtune/timing.py `estimate_run`)."""

from __future__ import annotations

from abtune.config import RunConfig
from abtune.errors import ConfigError
from abtune.promote.plan import Campaign
from abtune.study.cost import planned_run
from abtune.timing import estimate_run, load_cluster

DEFAULT_CLUSTER = "paper-a100-hdr200"


def gpu_hours_lines(campaign: Campaign, configs: dict[str, RunConfig], cluster_name: str | None) -> list[str]:
    """One line per run (GPUs x hours = GPU-hours) and the total; a run the cluster cannot hold says so."""
    cluster = load_cluster(cluster_name or DEFAULT_CLUSTER)
    chosen = "" if cluster_name else " (the default; --cluster NAME for yours)"
    lines, total, sources = [], 0.0, set()
    for run in campaign.runs:
        try:
            estimate = estimate_run(planned_run(configs[run.name], run.nodes, run.ranks_per_node), cluster)
        except ConfigError as error:
            lines.append(f"  run {run.name}: no estimate: {error}")
            continue
        hours = estimate.seconds / 3600
        total += hours * run.world_size
        sources.add(str(estimate.compute_source))
        lines.append(f"  run {run.name}: {run.world_size} GPUs x {hours:,.1f} h = {hours * run.world_size:,.0f} GPU-hours")
    head = [f"estimated GPU-hours on cluster {cluster.name}{chosen}, as DDP trains (AB's phases compute and send "
            "less); compute " + "; ".join(sorted(sources))]
    return [*head, *lines, f"  total: {total:,.0f} GPU-hours for {len(campaign.runs)} runs"]
