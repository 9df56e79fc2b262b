"""The trial tables `study best` and `study status` print: the objectives against the reference trials
(top-1 vs the paper defaults, inter-node MB vs DDP), every other objective, the searched parameters."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from optuna.trial import FrozenTrial
from rich.console import Console

from abtune import prose, tables
from abtune.attrs import (
    DDP,
    PAPER_DEFAULTS,
)
from abtune.objectives import OBJECTIVES
from abtune.study import importance, results
from abtune.study.live_view import with_spread
from abtune.study.spec import StudySpec

MEGA = 1e6


SHOWN_ALWAYS = ("top1", "inter_node_bytes", "compression")  # with their deltas against the references


# `study best` prints this much of a front: ties make fronts of hundreds
FRONT_ROWS = 20


def print_trials(console: Console, title: str, trials: Sequence[FrozenTrial], all_trials: Sequence[FrozenTrial],
                 spec: StudySpec, *, wide: bool = False, labelled: bool = False) -> None:
    """The objectives and compression (top-1 vs the paper defaults, inter-node MB vs DDP), every other objective
    the study optimizes, the searched parameters, then a note; a narrow terminal drops the deltas against the
    paper defaults and the note first (`labelled`: the note names the rows, and stays)."""
    ddp, paper = results.reference(all_trials, DDP), results.reference(all_trials, PAPER_DEFAULTS)
    more = [OBJECTIVES[m] for m in spec.objectives if m not in SHOWN_ALWAYS]
    section = prose.shared_section(spec.space)  # said once in the title, not in every parameter's header
    title += f" (parameters: {section}.*)" if section else ""
    columns = [tables.Column("trial", justify="left"), tables.Column("top1"), tables.Column("vs paper", tables.KEY),
               tables.Column("inter MB"), tables.Column("vs DDP"), tables.Column("compr"),
               *(tables.Column(o.label) for o in more), *(tables.Column(prose.short_key(p, section)) for p in spec.space),
               tables.Column("note", tables.ESSENTIAL if labelled else tables.KEY, "left", wrap=not labelled)]
    rows = []
    for trial in trials:
        a = trial.user_attrs
        params = [_format(trial.params.get(p, "-")) for p in spec.space]
        rows.append([str(trial.number), with_spread(f"{a['top1']:.4f}", a, "top1"),
                     _delta(a["top1"], paper, "top1", ratio=False),
                     with_spread(f"{a['inter_node_bytes'] / MEGA:.2f}", a, "inter_node_bytes", MEGA),
                     _delta(a["inter_node_bytes"], ddp, "inter_node_bytes", True),
                     f"{a['compression']:.2f}", *(with_source(o.name, o.show(a.get(o.name)), a) for o in more), *params, results.label(trial)])
    if labelled:  # the note names each row: beside the trial number, never in a continuation
        columns.insert(1, columns.pop())
        rows = [[row[0], row[-1], *row[1:-1]] for row in rows]
    tables.print_table(console, title, columns, rows, wide=wide, elsewhere=f"abtune study export {spec.name} has "
                       "every trial's values")


def with_source(name: str, shown: str, attrs: dict[str, Any]) -> str:
    """A predicted figure with where its compute came from, as `compare` prints it: `412.3 (published)`."""
    source = attrs.get("predicted_compute_source")
    return f"{shown} ({source})" if name.startswith("predicted") and source else shown


def _format(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _delta(value: float, reference: FrozenTrial | None, key: str, ratio: bool) -> str:
    if reference is None or key not in reference.user_attrs:
        return "-"
    base = reference.user_attrs[key]
    if ratio:
        return f"{value / base:.2f}x" if base else "-"
    return f"{value - base:+.4f}"


def print_front(console: Console, name: str, metrics: Sequence[str], front: Sequence[FrozenTrial],
                all_trials: Sequence[FrozenTrial], spec: StudySpec, *, wide: bool = False) -> None:
    """The front's first FRONT_ROWS trials (best top-1 first); the title says how many there are."""
    title = f"Pareto front ({', '.join(metrics)}): {len(front)} trial(s)"
    if len(front) > FRONT_ROWS:
        title += f", the {FRONT_ROWS} with the best top-1 shown (every trial: abtune study export {name})"
    print_trials(console, title, front[:FRONT_ROWS], all_trials, spec, wide=wide)


def objective_values(trial: FrozenTrial, spec: StudySpec) -> str:
    """`top-1 0.9528, inter-node MB 47.14`; a repeated trial's means, each with its spread over the seeds."""
    attrs = trial.user_attrs
    shown = [f"{o.label} {with_source(o.name, with_spread(o.show(attrs.get(o.name)), attrs, o.name, o.scale), attrs)}"
             for o in (OBJECTIVES[m] for m in importance.shown_objectives(spec))]
    seeds = attrs.get("top1_seeds")
    return (f"mean over {len(seeds)} seeds: " if seeds else "") + ", ".join(shown)
