"""The PNGs people look at: one run's curves, traffic and spectra; a study's front, importances, history.

matplotlib only (Agg, no display); every function writes one file and returns what it drew (`Drawn`), read
back from the figure: each labelled series' points, and how many data points a legend covers (legends sit
outside the axes, so none).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.container import BarContainer  # noqa: E402
from matplotlib.image import imsave  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.text import Text  # noqa: E402
from matplotlib.ticker import FuncFormatter, LogFormatter, MaxNLocator  # noqa: E402

from abtune import prose  # noqa: E402
from abtune.objectives import OBJECTIVES  # noqa: E402
from abtune.phases import Phase, colour_of, in_order  # noqa: E402

if TYPE_CHECKING:
    from abtune.objectives import Objective

REFERENCE_STYLE = {"ddp": ("*", "tab:red", "DDP reference"), "paper-defaults": ("D", "tab:green", "paper defaults")}
DPI = 110
MARGIN_INCHES = 0.1  # white around what a figure shows, as savefig(bbox_inches="tight") leaves
FEW_TRIALS = 20  # importances over fewer search trials than this come with a warning
LABELLED_POINTS = 30  # the close-up labels every trial up to this many; beyond, the front only
FRONT = "Pareto front"
SMALLEST_BAR_SHARE = 0.01  # a phase's traffic under this share of the plot's height draws no bar one can see
RING_CLEARANCE_PT = 9  # a label's distance right of a ringed or reference point: the ring's radius is about 8 pt
HISTORY_HEADROOM = 1.25  # the history's traffic axis reaches this multiple of its largest value


@dataclass(frozen=True)
class Drawn:
    """What a written figure shows: `series` maps each legend label to its points in data units (x, y),
    `covered` counts data points and bars that a legend hides; `texts` is what it says."""

    path: Path
    series: dict[str, list[tuple[float, float]]]
    covered: int
    texts: list[str]  # every text in the figure: titles, axis and tick labels, annotations, legend entries


def _save(figure: Any, path: Path) -> Drawn:
    figure.set_dpi(DPI)  # laid out, drawn and read back with the one renderer: its text sizes are measured once
    figure.tight_layout()
    _write_cropped(figure, path)
    texts = [text for artist in figure.findobj(Text) if artist.get_visible() and (text := artist.get_text())]
    drawn = Drawn(path, _series(figure), _covered(figure), texts)
    plt.close(figure)
    return drawn


def _write_cropped(figure: Any, path: Path) -> None:
    """The figure drawn once and written without its empty margins beyond MARGIN_INCHES, as
    savefig(bbox_inches="tight") writes it, which draws it twice more: once to measure, once cropped. What is
    drawn up to the canvas's edge may reach past it: savefig then draws it on a canvas widened to fit."""
    figure.canvas.draw()
    pixels = np.asarray(figure.canvas.buffer_rgba())
    rows, columns = np.nonzero((pixels != pixels[0, 0]).any(axis=2))  # what differs from the background
    height, width = pixels.shape[:2]
    if not rows.size or rows[0] == 0 or rows[-1] == height - 1 or columns.min() == 0 or columns.max() == width - 1:
        figure.savefig(path, dpi=DPI, bbox_inches="tight", pad_inches=MARGIN_INCHES)
        return
    margin = round(MARGIN_INCHES * DPI)
    imsave(path, pixels[max(rows[0] - margin, 0):rows[-1] + 1 + margin,
                        max(columns.min() - margin, 0):columns.max() + 1 + margin], dpi=DPI)


def _series(figure: Any) -> dict[str, list[tuple[float, float]]]:
    found: dict[str, list[tuple[float, float]]] = {}
    for axis in figure.axes:
        for artist in [*axis.lines, *axis.collections]:
            label = str(artist.get_label())
            if label.startswith("_"):
                continue
            points = artist.get_xydata() if isinstance(artist, Line2D) else artist.get_offsets()
            found.setdefault(label, []).extend((float(x), float(y)) for x, y in points)
    return found


def _covered(figure: Any) -> int:
    """Data points (line vertices, scatter offsets) and bars inside any legend's box, in display space."""
    renderer = figure.canvas.get_renderer()
    boxes = [legend.get_window_extent(renderer) for axis in figure.axes if (legend := axis.get_legend())]
    boxes += [legend.get_window_extent(renderer) for legend in figure.legends]
    if not boxes:
        return 0
    count = 0
    for axis in figure.axes:
        for artist in [*axis.lines, *axis.collections]:
            points = artist.get_xydata() if isinstance(artist, Line2D) else artist.get_offsets()
            if len(points) == 0:
                continue
            display = artist.get_transform().transform(points) if isinstance(artist, Line2D) else \
                artist.get_offset_transform().transform(points)
            shown = [(x, y) for x, y in display if axis.bbox.contains(x, y)]  # not clipped away by the limits
            count += sum(1 for x, y in shown if any(box.contains(x, y) for box in boxes))
        for container in axis.containers:
            if isinstance(container, BarContainer):
                count += sum(1 for bar in container
                             if any(box.overlaps(bar.get_window_extent(renderer)) for box in boxes))
    return count


def _legend_outside(axis: Any, **options: Any) -> None:
    """A legend right of the axes, where it covers no data."""
    axis.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize="small", **options)


def _shade_phases(axis: Any, segments: list[tuple[str, int, int]], legend: bool) -> None:
    labelled: set[str] = set()
    for phase, start, end in segments:
        if phase == Phase.TRAIN:
            continue
        axis.axvspan(start, end, color=colour_of(phase), alpha=0.25, lw=0,
                     label=f"{phase} phase" if legend and phase not in labelled else None)
        labelled.add(phase)


def accuracy_and_loss(records: list[dict[str, Any]], segments: list[tuple[str, int, int]], path: Path,
                      run: str = "") -> Drawn:
    """Validation top-1/top-5 and train/validation loss over steps, phases shaded; `run` names it in the title."""
    logs = [r for r in records if r.get("kind") == "log"]
    evals = [r for r in records if r.get("kind") == "evaluation"]
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    for axis in (top, bottom):
        _shade_phases(axis, segments, legend=axis is top)
    top.plot([r["step"] for r in evals], [r["val_top1"] for r in evals], "o-", label="val top-1")
    top.plot([r["step"] for r in evals], [r["val_top5"] for r in evals], "s--", label="val top-5")
    top.set_ylabel("accuracy")
    if run:
        top.set_title(f"{run}: accuracy and loss", fontsize=10)
    _legend_outside(top)
    bottom.plot([r["step"] for r in logs], [r["loss"] for r in logs], label="train loss")
    bottom.plot([r["step"] for r in evals], [r["val_loss"] for r in evals], "o-", label="val loss")
    bottom.set_yscale("log")
    # plain numbers ("0.1", and "2.35" where a loss spans under a decade), not math text's 10^-1 and 2.35x10^0
    bottom.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    bottom.yaxis.set_minor_formatter(LogFormatter())  # labels a few minor ticks only within a decade
    bottom.set_xlabel("step")
    bottom.set_ylabel("loss")
    _legend_outside(bottom)
    return _save(figure, path)


def traffic_per_phase(summary: dict[str, Any], path: Path, run: str = "") -> Drawn:
    """Wire bytes per rank (mean over ranks) per phase in the order phases happen, inter-node stacked on
    intra-node; beside them the training phases' inter-node sum, what a study optimizes, against DDP's.
    A phase that sent nothing, or too little to see (under SMALLEST_BAR_SHARE of the plot's height), has no bar:
    the title names it with its MB; `run` names the run in the title."""
    traffic = summary["traffic"]
    by_phase = traffic["by_phase"]
    ddp = traffic.get("ddp_reference_inter_node_bytes")
    height = max([by_phase[p]["total"]["mean"] for p in by_phase] + [traffic["training_inter_node_bytes"], ddp or 0.0])
    silent = [p for p in in_order(by_phase) if not by_phase[p]["total"]["mean"]]
    tiny = [p for p in in_order(by_phase) if p not in silent and by_phase[p]["total"]["mean"] < SMALLEST_BAR_SHARE * height]
    phases = [p for p in in_order(by_phase) if p not in silent and p not in tiny]
    inter = [by_phase[p]["inter"]["mean"] / 1e6 for p in phases]
    intra = [(by_phase[p]["total"]["mean"] - by_phase[p]["inter"]["mean"]) / 1e6 for p in phases]
    training = traffic["training_inter_node_bytes"] / 1e6
    figure, axis = plt.subplots(figsize=(7.5, 5))
    positions = list(range(len(phases)))
    axis.bar(positions, inter, label="inter-node", color="tab:red")
    axis.bar(positions, intra, bottom=inter, label="intra-node", color="tab:blue")
    total_at = len(phases) + 0.5
    axis.bar([total_at], [training], color="tab:red", hatch="//", edgecolor="white",
             label=f"inter-node, the training phases together ({training:,.1f} MB)")
    axis.set_xticks([*positions, total_at], [*phases, "training phases,\ninter-node"], fontsize=8, rotation=30,
                    ha="right", rotation_mode="anchor")
    title = f"{run + ': ' if run else ''}{summary['method']} traffic per phase, MB per rank (mean over ranks)"
    if ddp:
        axis.axhline(ddp / 1e6, color="k", ls="--", lw=1, label=f"DDP training inter-node ({ddp / 1e6:,.1f} MB)")
        title += f"\ntraining inter-node {training:,.1f} MB = {training / (ddp / 1e6):.2f}x DDP's"
    axis.set_ylabel("MB per rank")
    if tiny:
        title += "\ntoo small to draw: " + ", ".join(f"{p} {_small_amount(by_phase[p]['total']['mean'])}" for p in tiny)
    if silent:
        title += f"\nno traffic in {', '.join(silent)}"
    axis.set_title(title, fontsize=10)
    axis.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), ncols=2, fontsize="small")
    return _save(figure, path)


def _small_amount(nbytes: float) -> str:
    """`0.47 MB`; under 0.01 MB in kB (`1.2 kB`), where MB would read 0.00; under 0.1 kB in bytes (`40 B`)."""
    if nbytes >= 1e4:
        return f"{nbytes / 1e6:.2f} MB"
    return f"{nbytes / 1e3:.1f} kB" if nbytes >= 100 else f"{nbytes:.0f} B"


def short_layer_names(layers: list[str]) -> list[str]:
    """Layer names without the prefix every layer shares and without a trailing `.weight`: the block index
    stays (`encoder_layer_3.mlp.0`)."""
    parts = [name.split(".") for name in layers]
    shared = 0
    while len(parts) > 1 and all(len(p) > shared + 1 for p in parts) and len({p[shared] for p in parts}) == 1:
        shared += 1
    return [".".join(p[shared:-1] if p[-1] == "weight" and len(p) > shared + 1 else p[shared:]) for p in parts]


def spectra(summary: dict[str, Any], cutoff: float | None, path: Path, run: str = "") -> Drawn | None:
    """Normalized singular values per layer at the last decomposition, with the rank each layer kept; each
    layer's kept-rank bar and its name on the right have the colour of its spectrum (the colour key)."""
    values, decompositions = summary.get("spectra") or {}, summary.get("decompositions") or []
    if not values or not decompositions:
        return None
    ranks = decompositions[-1]["ranks"]
    layers = list(values)
    names = short_layer_names(layers)
    figure, (left, right) = plt.subplots(1, 2, figsize=(13, max(5.0, 0.22 * len(layers) + 1.5)),
                                         gridspec_kw={"width_ratios": [1.2, 1]})
    colors = []
    for layer, name in zip(layers, names, strict=True):
        sigma = values[layer]
        normalized = [s / sigma[0] for s in sigma] if sigma and sigma[0] else sigma
        (line,) = left.plot(range(1, len(sigma) + 1), normalized, lw=1, label=f"_{name}")
        colors.append(line.get_color())
        kept = ranks.get(layer)
        if kept:
            left.plot([kept], [normalized[kept - 1]], "o", color=line.get_color(), ms=4, label=f"_{name} kept")
    title = f"{run + ': ' if run else ''}spectra at step {decompositions[-1]['step']} (dots: the rank kept"
    if cutoff is not None:
        left.axhline(cutoff, color="k", ls="--", lw=1, label=f"sigma cutoff {cutoff:.4g}")
        title += f"; dashed: sigma cutoff {cutoff:.4g}"
    left.set_yscale("log")
    left.set_xlabel("index i")
    left.set_ylabel("σ_i / σ_max")
    left.set_title(title + ")\ncolours: the layers named on the right", fontsize=10)
    rows = range(len(layers))
    right.barh(rows, [len(values[k]) for k in layers], color="0.88", label="full rank")
    dense = set(decompositions[-1].get("kept_full_rank") or [])  # factors would not have saved anything
    factored = [i for i, k in enumerate(layers) if k not in dense]
    right.barh(factored, [ranks.get(layers[i], 0) for i in factored], color=[colors[i] for i in factored],
               label="kept rank (colour of its spectrum)")
    kept_dense = [i for i, k in enumerate(layers) if k in dense]
    if kept_dense:  # a full bar, not an empty one: the layer kept every rank
        right.barh(kept_dense, [len(values[layers[i]]) for i in kept_dense], color=[colors[i] for i in kept_dense],
                   hatch="//", edgecolor="white", label="kept dense (full rank)")
    right.set_yticks(rows, names, fontsize=7)
    for label, color in zip(right.get_yticklabels(), colors, strict=True):
        label.set_color(color)
    right.invert_yaxis()
    right.set_xlabel("rank")
    right.legend(loc="lower left", bbox_to_anchor=(0.0, 1.02), borderaxespad=0.0, fontsize="small", ncols=3)
    return _save(figure, path)


# --- studies --------------------------------------------------------------------------------
def _xy(points: list[dict[str, Any]], y: Objective, x: Objective) -> tuple[list[float], list[float]]:
    return [p["x"] / x.scale for p in points], [p["y"] / y.scale for p in points]


def _numbers(points: list[dict[str, Any]]) -> str:
    return ", ".join(str(p["number"]) for p in points)


def pareto_front(points: list[dict[str, Any]], y: Objective, x: Objective, path: Path,
                 front_on: Sequence[Objective] = ()) -> Drawn:
    """`y` against `x`; each point: {number, y, x, front, reference, compression, y_std, x_std}. The front is
    the search trials' on `front_on` (default: `y` and `x`); found on more objectives than the two drawn, its
    trials are marked, not joined by a line, and the title says on which. The reference trials have their
    own markers. With a DDP reference a second panel shows the search up close, its top axis in multiples of
    DDP's `x`."""
    ddp = [p for p in points if p["reference"] == "ddp"]
    search = [p for p in points if p["reference"] != "ddp"]
    panels = 2 if ddp and search else 1
    figure, axes = plt.subplots(1, panels, figsize=(7 + 5.5 * (panels - 1), 5.5), squeeze=False)
    whole = axes[0][0]
    front_label = _front_label(front_on)
    _draw_front(whole, points, y, x, front_label, legend=True)
    title = "Pareto front of the search" + (" and the DDP reference" if ddp else "")
    if front_label != FRONT:
        title = f"{title}\non all {len(front_on)} objectives, drawn on {y.label} and {x.label}"
    whole.set_title(title, fontsize=10)
    if panels == 2:
        close = axes[0][1]
        _draw_front(close, points, y, x, front_label, legend=False)
        _zoom(close, _xy(search, y, x))
        ddp_x = ddp[0]["x"] / x.scale
        if ddp_x > 0:
            top = close.secondary_xaxis("top", functions=(lambda v: v / ddp_x, lambda r: r * ddp_x))
            top.set_xlabel(f"{x.label} as a multiple of DDP's", fontsize=8)
            top.tick_params(labelsize=8)
        close.set_title("the search up close (labels: trial, trained-model compression)", fontsize=10)
    _legend_outside(axes[0][-1], handles=whole.get_legend_handles_labels()[0])
    return _save(figure, path)


def _front_label(front_on: Sequence[Objective]) -> str:
    """The front's legend entry: `Pareto front`, or the objectives it was found on when they are more than two."""
    return FRONT if len(front_on) <= 2 else f"{FRONT} on {', '.join(o.label for o in front_on)}"


def _draw_front(axis: Any, points: list[dict[str, Any]], y: Objective, x: Objective, front_label: str,
                legend: bool) -> None:
    """One panel of the Pareto plot; `legend` False: its artists stay out of the legend and of `Drawn`."""
    hidden = "" if legend else "_"
    others = [p for p in points if not p["front"] and not p["reference"]]
    front = sorted((p for p in points if p["front"]), key=lambda p: p["x"])
    if others:
        axis.scatter(*_xy(others, y, x), c="0.6", s=20, label=f"{hidden}other trials")
    # A front on two objectives is a staircase in this plane; on more, its trials' shadows here are not
    axis.plot(*_xy(front, y, x), "o-" if front_label == FRONT else "o", c="tab:blue", label=f"{hidden}{front_label}")
    chosen = [p for p in points if p.get("recommended")]
    if chosen:  # a ring around the point, so the point's own marker (front, reference) still shows
        axis.scatter(*_xy(chosen, y, x), marker="o", s=240 if legend else 200, facecolors="none",
                     edgecolors="tab:orange", linewidths=1.8, zorder=6, label=f"{hidden}recommended (trial {_numbers(chosen)})")
    for kind, (marker, color, text) in REFERENCE_STYLE.items():
        marked = [p for p in points if p["reference"] == kind]
        if marked:
            axis.scatter(*_xy(marked, y, x), marker=marker, s=160 if legend else 110, c=color, zorder=5,
                         alpha=1.0 if legend else 0.85, label=f"{hidden}{text} (trial {_numbers(marked)})")
    labelled = front if legend or len(points) > LABELLED_POINTS else [p for p in points if p["reference"] != "ddp"]
    for p in labelled:  # the front's labels above their points, the others' below: neighbours rarely collide
        compression = p.get("compression")
        text = f"{p['number']} ({compression:.1f}:1)" if compression and compression > 1.005 else str(p["number"])
        clear = RING_CLEARANCE_PT if p.get("recommended") or p["reference"] else 4  # past a ring or a big marker
        axis.annotate(text, (p["x"] / x.scale, p["y"] / y.scale), fontsize=7, xytext=(clear, 3 if p["front"] else -10),
                      textcoords="offset points", annotation_clip=True, zorder=7)
    spread = [p for p in points if p.get("y_std") is not None]
    if spread:  # seed repeats: one standard deviation over the seeds either way
        axis.errorbar(*_xy(spread, y, x), yerr=[_finite(p["y_std"]) / y.scale for p in spread],
                      xerr=[_finite(p.get("x_std")) / x.scale for p in spread], fmt="none", ecolor="0.4",
                      elinewidth=0.8, capsize=2, zorder=1, label=f"{hidden}± 1 std over seeds")
    axis.set_xlabel(f"{x.label} ({x.direction})")
    axis.set_ylabel(f"{y.label} ({y.direction})")


def _zoom(axis: Any, xy: tuple[list[float], list[float]]) -> None:
    """Limits around the given points, with room for their labels."""
    for values, set_limits, room in ((xy[0], axis.set_xlim, (0.06, 0.18)), (xy[1], axis.set_ylim, (0.08, 0.12))):
        low, high = min(values), max(values)
        span = (high - low) or abs(high) * 0.05 or 1.0
        set_limits(low - room[0] * span, high + room[1] * span)


def confirmation_intervals(rows: list[dict[str, Any]], objectives: list[Objective], path: Path) -> Drawn:
    """Per objective: each configuration's mean with its 95% interval (bar) and its seeds' values (dots).

    rows: {name, OBJECTIVE NAME: {mean, low, high, values}}.
    """
    figure, axes = plt.subplots(1, len(objectives), figsize=(5.5 * len(objectives), 1.2 + 0.6 * len(rows)),
                                squeeze=False)
    names = [r["name"] for r in rows][::-1]
    for axis, objective in zip(axes[0], objectives, strict=True):
        scale = objective.scale
        for y, row in enumerate(rows[::-1]):
            m = row[objective.name]
            bounded = math.isfinite(m["low"]) and math.isfinite(m["high"])  # no interval for one seed
            error = [[(m["mean"] - m["low"]) / scale], [(m["high"] - m["mean"]) / scale]] if bounded else None
            axis.errorbar([m["mean"] / scale], [y], xerr=error, fmt="o", c="tab:blue", capsize=4)
            axis.scatter([v / scale for v in m["values"]], [y] * len(m["values"]), s=12, c="0.5", zorder=3)
        axis.set_yticks(range(len(names)), names, fontsize=8)
        axis.set_xlabel(f"{objective.label} ({objective.direction})")
        axis.grid(True, axis="x", alpha=0.3)
        if objective.name == "top1":  # an interval may reach past 1; top-1 cannot
            low, high = axis.get_xlim()
            axis.set_xlim(max(low, 0.0), min(high, 1.0))
    axes[0][0].set_title("mean and 95% interval (dots: seeds)", fontsize=9, loc="left")
    return _save(figure, path)


def _finite(value: float | None) -> float:
    return value if value is not None and math.isfinite(value) else 0.0


def importances(by_objective: dict[str, dict[str, float]], trials: int, path: Path,
                p_values: dict[str, dict[str, float]] | None = None, significant: float = 0.05) -> Drawn:
    """Optuna's importances per objective, titled with the number of search trials they rest on; with
    `p_values` (against shuffled objective values) each bar carries its p, and an objective none of whose
    parameters beats the shuffles (p <= `significant`) says so in its title, as `study best` does."""
    figure, axes = plt.subplots(1, len(by_objective), figsize=(6 * len(by_objective), 4.8), squeeze=False)
    for axis, (objective, values) in zip(axes[0], by_objective.items(), strict=True):
        names = list(values)[::-1]
        section = prose.shared_section(names)  # `method.` said once, in the title, not on every bar
        axis.barh([prose.short_key(n, section) for n in names], [values[n] for n in names], color="tab:blue")
        known = OBJECTIVES.get(objective)
        label = objective if known is None else known.label + (" per rank" if known.unit == "MB" else "")
        title = f"importance for {label}" + (f" ({section}.*)" if section else "")
        ps = (p_values or {}).get(objective)
        if ps:
            for row, name in enumerate(names):
                if name in ps:
                    axis.annotate(f" p={ps[name]:.2f}", (values[name], row), va="center", fontsize=7)
            axis.set_xlim(0, 1.15 * max(values.values(), default=1.0))  # room for the p labels
            if min(ps.values()) > significant:
                title += f"\nindistinguishable from shuffled values (no p <= {significant})"
        axis.set_title(title, color="tab:red" if ps and min(ps.values()) > significant else "black")
        axis.set_xlabel("importance (Optuna's default evaluator)")
        axis.tick_params(axis="y", labelsize=7)
    basis = f"computed over {trials} completed search trial{'s' if trials != 1 else ''}"
    if trials < FEW_TRIALS:
        basis += (f"\nwarning: fewer than {FEW_TRIALS} trials; importances over so few are a rough indication, "
                  "and more trials can reorder them")
    figure.suptitle(basis, color="tab:red" if trials < FEW_TRIALS else "black", fontsize=10)
    return _save(figure, path)


def optimization_history(points: list[dict[str, Any]], y: Objective, x: Objective, path: Path) -> Drawn:
    """`y` and `x` per trial number, with the best `y` of the search so far; the DDP reference starred,
    its `x` also as a dashed line across."""
    ordered = sorted(points, key=lambda p: p["number"])
    search = [p for p in ordered if p["reference"] != "ddp"]
    ddp = [p for p in ordered if p["reference"] == "ddp"]
    figure, top = plt.subplots(figsize=(10, 4.5))
    numbers = [p["number"] for p in search]
    top.plot(numbers, [p["y"] / y.scale for p in search], "o", c="tab:blue", label=y.label)
    best, running = [], None
    for p in search:
        value = p["y"] / y.scale
        running = value if running is None else (max if y.maximize else min)(running, value)
        best.append(running)
    top.step(numbers, best, where="post", c="tab:blue", alpha=0.6, label=f"best {y.label} so far")
    top.set_xlabel("trial")
    top.xaxis.set_major_locator(MaxNLocator(integer=True))  # trials are numbered, not measured
    top.set_ylabel(y.label, color="tab:blue")
    right = top.twinx()
    right.plot(numbers, [p["x"] / x.scale for p in search], "x", c="tab:red", label=x.label)
    right.set_ylabel(x.label, color="tab:red")
    # traffic from 0, with room above its largest value: DDP's line (usually the largest) then runs below the top,
    # not on the best top-1 line that the left axis puts there
    right.set_ylim(0, HISTORY_HEADROOM * max([p["x"] / x.scale for p in ordered], default=1.0))
    for p in ddp:
        top.plot([p["number"]], [p["y"] / y.scale], "*", ms=12, c="tab:blue", label=f"{y.label}, DDP reference")
        right.plot([p["number"]], [p["x"] / x.scale], "*", ms=12, c="tab:red", label=f"{x.label}, DDP reference")
        right.axhline(p["x"] / x.scale, c="tab:red", ls=":", lw=1, label=f"{x.label} of DDP (right axis)")
    top.set_title(f"optimization history: {y.label} (left axis) and {x.label} (right axis) per trial", fontsize=10)
    handles, labels = top.get_legend_handles_labels()
    more_handles, more_labels = right.get_legend_handles_labels()
    top.legend(handles + more_handles, labels + more_labels, loc="upper center", bbox_to_anchor=(0.5, -0.16),
               ncols=3, fontsize="small")
    return _save(figure, path)


def evaluation_curves(curves: list[dict[str, Any]], y: Objective, x: Objective, path: Path,
                      references: list[dict[str, Any]] | None = None) -> Drawn:
    """Per trial, `y` so far and `x` as predicted at each evaluation; pruned trials dashed, ending in x; the
    DDP reference's final values (it reports no evaluations) as dotted lines across, or in the legend when
    they lie far off the trials' range. Up to 20 trials, each line ends in its trial number."""
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    kinds = {}
    ends: dict[Any, list[tuple[float, float, str, str]]] = {top: [], bottom: []}
    for curve in curves:
        kind = "pruned" if curve["pruned"] else curve["reference"] if curve["reference"] in CURVE_STYLES else "search"
        kinds[kind] = True
        for axis, key, objective in ((top, "y", y), (bottom, "x", x)):
            known = [(s, v / objective.scale) for s, v in zip(curve["steps"], curve[key], strict=True) if v is not None]
            if not known:
                continue
            axis.plot(*zip(*known, strict=True), marker=".", lw=1, label=f"_trial {curve['number']}", **CURVE_STYLES[kind])
            if curve["pruned"]:
                axis.plot(*known[-1], "x", c="tab:red", label="_pruned here")
            ends[axis].append((*known[-1], str(curve["number"]), CURVE_STYLES[kind]["c"]))
    handles = [Line2D([], [], marker=".", lw=1, label=CURVE_LABELS[kind], **CURVE_STYLES[kind]) for kind in CURVE_STYLES
               if kind in kinds]
    for p in [p for p in references or [] if p["reference"] == "ddp"]:
        values = [(axis, p[key] / objective.scale) for axis, key, objective in ((top, "y", y), (bottom, "x", x))]
        shown = [_reference_line(axis, value, [e[1] for e in ends[axis]]) for axis, value in values]
        text = f"DDP reference, final (trial {p['number']}):\n{y.label} {y.show(p['y'])}, {x.label} {x.show(p['x'])}"
        off = [name for name, drawn in zip((y.label, x.label), shown, strict=True) if not drawn]
        handles.append(Line2D([], [], c="k", ls=":", lw=1.2, label=text + (f" ({', '.join(off)} off the scale)" if off else "")))
    bottom.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncols=len(handles), fontsize="small")
    top.set_ylabel(f"{y.label} at the evaluation")
    bottom.set_ylabel(f"{x.label}, final as predicted")
    bottom.set_xlabel("step")
    named = len(curves) <= 20  # beyond that, trial numbers at the line ends only clutter
    top.set_title("what each trial reported at its evaluations" + (" (numbers: trials)" if named else ""), fontsize=10)
    if named:
        for axis, labels in ends.items():
            _label_ends(figure, axis, labels)
    return _save(figure, path)


CURVE_STYLES = {"search": {"ls": "-", "c": "tab:blue", "alpha": 0.8},
                "paper-defaults": {"ls": "-", "c": "tab:green", "alpha": 0.9},
                "pruned": {"ls": "--", "c": "tab:red", "alpha": 0.7}}
CURVE_LABELS = {"search": "search trial", "paper-defaults": "paper defaults", "pruned": "pruned (x: where it stopped)"}


def _reference_line(axis: Any, value: float, data: list[float]) -> bool:
    """A dotted line at `value` unless it lies more than the data's own span away from them (it would
    squash them flat); whether it was drawn."""
    if data:
        low, high = min(data), max(data)
        span = max(high - low, abs(high) * 0.05, 1e-12)
        if value > high + 2 * span or value < low - 2 * span:
            return False
    axis.axhline(value, c="k", ls=":", lw=1.2, label="_DDP reference, final")
    return True


def _label_ends(figure: Any, axis: Any, ends: list[tuple[float, float, str, str]], gap_pt: float = 8.0) -> None:
    """Each line's label right of its last point; labels that would overlap are spread `gap_pt` apart as a
    group centred on where they belong, within the axes."""
    axis.get_ylim()  # the limits made final from the data drawn so far (transData reads them as they are)
    to_points = 72.0 / figure.dpi
    ordered = sorted(ends, key=lambda e: (e[1], e[0]))
    wanted = [axis.transData.transform((x, y))[1] * to_points for x, y, _, _ in ordered]
    placed = spread(wanted, gap_pt, axis.bbox.y0 * to_points, axis.bbox.y1 * to_points)
    for (x, y, text, color), at, height in zip(ordered, placed, wanted, strict=True):
        axis.annotate(text, (x, y), xytext=(4, at - height - 3), textcoords="offset points", fontsize=6,
                      color=color, annotation_clip=False)


def spread(wanted: list[float], gap: float, low: float, high: float) -> list[float]:
    """Positions for labels wanted at ascending `wanted`: at least `gap` apart, each group of neighbours that
    would crowd centred on the mean of where its members belong, and kept within [low, high]."""
    groups: list[list[float]] = []
    for value in wanted:
        groups.append([value])
        while len(groups) > 1 and _start(groups[-2], gap) + gap * len(groups[-2]) > _start(groups[-1], gap):
            groups[-2:] = [groups[-2] + groups[-1]]
    placed = []
    for group in groups:
        start = min(max(_start(group, gap), low), max(low, high - gap * (len(group) - 1)))
        placed += [start + gap * i for i in range(len(group))]
    return placed


def _start(group: list[float], gap: float) -> float:
    return sum(group) / len(group) - gap * (len(group) - 1) / 2
