"""The PNGs people look at: one run's curves, traffic and spectra; a study's front, importances, history.

matplotlib only (Agg, no display); every function writes one file and returns its path.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

if TYPE_CHECKING:
    from abtune.objectives import Objective

PHASE_COLORS = {"warmup": "0.85", "ab": "tab:orange", "rebound": "tab:cyan", "train": "0.95"}
DPI = 110


def _save(figure: Any, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=DPI)
    plt.close(figure)
    return path


def _shade_phases(axis: Any, segments: list[tuple[str, int, int]]) -> None:
    labelled: set[str] = set()
    for phase, start, end in segments:
        if phase == "train":
            continue
        axis.axvspan(start, end, color=PHASE_COLORS.get(phase, "0.9"), alpha=0.25, lw=0,
                     label=None if phase in labelled else phase)
        labelled.add(phase)


def accuracy_and_loss(records: list[dict[str, Any]], segments: list[tuple[str, int, int]], path: Path) -> Path:
    """Validation top-1/top-5 and train/validation loss over steps, phases shaded."""
    logs = [r for r in records if r.get("kind") == "log"]
    evals = [r for r in records if r.get("kind") == "evaluation"]
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for axis in (top, bottom):
        _shade_phases(axis, segments)
    top.plot([r["step"] for r in evals], [r["val_top1"] for r in evals], "o-", label="val top-1")
    top.plot([r["step"] for r in evals], [r["val_top5"] for r in evals], "s--", label="val top-5")
    top.set_ylabel("accuracy")
    top.legend(loc="lower right", fontsize="small")
    bottom.plot([r["step"] for r in logs], [r["loss"] for r in logs], label="train loss")
    bottom.plot([r["step"] for r in evals], [r["val_loss"] for r in evals], "o-", label="val loss")
    bottom.set_yscale("log")
    bottom.set_xlabel("step")
    bottom.set_ylabel("loss")
    bottom.legend(loc="upper right", fontsize="small")
    return _save(figure, path)


def traffic_per_phase(summary: dict[str, Any], path: Path) -> Path:
    """Wire bytes per rank (mean over ranks) per phase, inter-node stacked on intra-node."""
    by_phase = summary["traffic"]["by_phase"]
    phases = list(by_phase)
    inter = [by_phase[p]["inter"]["mean"] / 1e6 for p in phases]
    intra = [(by_phase[p]["total"]["mean"] - by_phase[p]["inter"]["mean"]) / 1e6 for p in phases]
    figure, axis = plt.subplots(figsize=(8, 4.5))
    axis.bar(phases, inter, label="inter-node", color="tab:red")
    axis.bar(phases, intra, bottom=inter, label="intra-node", color="tab:blue")
    ddp = summary["traffic"]["ddp_reference_bytes"] / 1e6
    axis.axhline(ddp, color="k", ls="--", lw=1, label=f"DDP reference ({ddp:,.1f} MB)")
    axis.set_ylabel("MB per rank")
    axis.set_title(f"{summary['method']}: traffic per phase (reduction vs DDP "
                   f"{summary['traffic']['reduction_vs_ddp']:.2f}:1)")
    axis.legend(fontsize="small")
    return _save(figure, path)


def spectra(summary: dict[str, Any], cutoff: float | None, path: Path) -> Path | None:
    """Normalized singular values per layer at the last decomposition, with the rank each layer kept."""
    values, decompositions = summary.get("spectra") or {}, summary.get("decompositions") or []
    if not values or not decompositions:
        return None
    ranks = decompositions[-1]["ranks"]
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 5))
    for layer, sigma in values.items():
        normalized = [s / sigma[0] for s in sigma] if sigma and sigma[0] else sigma
        (line,) = left.plot(range(1, len(sigma) + 1), normalized, lw=1)
        kept = ranks.get(layer)
        if kept:
            left.plot([kept], [normalized[kept - 1]], "o", color=line.get_color(), ms=4)
    if cutoff is not None:
        left.axhline(cutoff, color="k", ls="--", lw=1, label=f"cutoff {cutoff}")
        left.legend(fontsize="small")
    left.set_yscale("log")
    left.set_xlabel("index i")
    left.set_ylabel("σ_i / σ_max")
    left.set_title(f"spectra at step {decompositions[-1]['step']} (dots: chosen rank)")
    layers = list(values)
    right.barh(range(len(layers)), [len(values[k]) for k in layers], color="0.85", label="full rank")
    right.barh(range(len(layers)), [ranks.get(k, 0) for k in layers], color="tab:orange", label="kept rank")
    right.set_yticks(range(len(layers)), [".".join(k.split(".")[-3:]) for k in layers], fontsize=6)
    right.invert_yaxis()
    right.set_xlabel("rank")
    right.legend(fontsize="small")
    return _save(figure, path)


# --- studies --------------------------------------------------------------------------------
def pareto_front(points: list[dict[str, Any]], y: Objective, x: Objective, path: Path) -> Path:
    """`y` against `x`; each point: {number, y, x, front, reference, compression, y_std, x_std}."""
    figure, axis = plt.subplots(figsize=(8, 5.5))
    others = [p for p in points if not p["front"] and not p["reference"]]
    front = sorted((p for p in points if p["front"]), key=lambda p: p["x"])
    axis.scatter([p["x"] / x.scale for p in others], [p["y"] / y.scale for p in others], c="0.6", s=20, label="trials")
    axis.plot([p["x"] / x.scale for p in front], [p["y"] / y.scale for p in front], "o-", c="tab:blue",
              label="Pareto front")
    for marker, name in (("*", "ddp"), ("D", "paper-defaults")):
        marked = [p for p in points if p["reference"] == name]
        if marked:
            axis.scatter([p["x"] / x.scale for p in marked], [p["y"] / y.scale for p in marked], marker=marker,
                         s=160, c="tab:red" if name == "ddp" else "tab:green", zorder=5, label=name)
    for p in front:
        compression = p.get("compression")
        text = f"{p['number']} ({compression:.1f}:1)" if compression and compression > 1.005 else str(p["number"])
        axis.annotate(text, (p["x"] / x.scale, p["y"] / y.scale), fontsize=7, xytext=(3, 3),
                      textcoords="offset points")
    spread = [p for p in points if p.get("y_std") is not None]
    if spread:  # seed repeats: one standard deviation over the seeds either way
        axis.errorbar([p["x"] / x.scale for p in spread], [p["y"] / y.scale for p in spread],
                      yerr=[_finite(p["y_std"]) / y.scale for p in spread],
                      xerr=[_finite(p.get("x_std")) / x.scale for p in spread],
                      fmt="none", ecolor="0.4", elinewidth=0.8, capsize=2, zorder=1, label="± 1 std over seeds")
    axis.set_xlabel(f"{x.label} ({x.direction})")
    axis.set_ylabel(f"{y.label} ({y.direction})")
    axis.set_title("Pareto front (labels: trial, trained-model compression)")
    axis.legend(fontsize="small")
    return _save(figure, path)


def confirmation_intervals(rows: list[dict[str, Any]], objectives: list[Objective], path: Path) -> Path:
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
    axes[0][0].set_title("mean and 95% interval (dots: seeds)", fontsize=9, loc="left")
    return _save(figure, path)


def _finite(value: float | None) -> float:
    return value if value is not None and math.isfinite(value) else 0.0


def importances(by_objective: dict[str, dict[str, float]], path: Path) -> Path:
    figure, axes = plt.subplots(1, len(by_objective), figsize=(6 * len(by_objective), 4.5), squeeze=False)
    for axis, (objective, values) in zip(axes[0], by_objective.items(), strict=True):
        names = list(values)[::-1]
        axis.barh(names, [values[n] for n in names], color="tab:blue")
        axis.set_title(f"importance for {objective}")
        axis.set_xlabel("importance (Optuna's default evaluator)")
        axis.tick_params(axis="y", labelsize=7)
    return _save(figure, path)


def optimization_history(points: list[dict[str, Any]], y: Objective, x: Objective, path: Path) -> Path:
    """`y` and `x` per trial number, with the best `y` so far."""
    ordered = sorted(points, key=lambda p: p["number"])
    figure, top = plt.subplots(figsize=(9, 4.5))
    numbers = [p["number"] for p in ordered]
    top.plot(numbers, [p["y"] / y.scale for p in ordered], "o", c="tab:blue", label=y.label)
    best, running = [], None
    for p in ordered:
        value = p["y"] / y.scale
        running = value if running is None else (max if y.maximize else min)(running, value)
        best.append(running)
    top.step(numbers, best, where="post", c="tab:blue", alpha=0.6, label=f"best {y.label} so far")
    top.set_xlabel("trial")
    top.set_ylabel(y.label, color="tab:blue")
    right = top.twinx()
    right.plot(numbers, [p["x"] / x.scale for p in ordered], "x", c="tab:red", label=x.label)
    right.set_ylabel(x.label, color="tab:red")
    top.legend(loc="lower left", fontsize="small")
    right.legend(loc="lower right", fontsize="small")
    return _save(figure, path)


def evaluation_curves(curves: list[dict[str, Any]], y: Objective, x: Objective, path: Path) -> Path:
    """Per trial, `y` so far and `x` as predicted at each evaluation; pruned trials dashed, ending in x."""
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    for curve in curves:
        style = {"ls": "--", "c": "tab:red", "alpha": 0.7} if curve["pruned"] else \
            {"ls": "-", "c": "tab:green" if curve["reference"] else "tab:blue", "alpha": 0.8}
        for axis, key, objective in ((top, "y", y), (bottom, "x", x)):
            known = [(s, v / objective.scale) for s, v in zip(curve["steps"], curve[key], strict=True) if v is not None]
            if known:
                axis.plot(*zip(*known, strict=True), marker=".", lw=1, **style)
                if curve["pruned"]:
                    axis.plot(*known[-1], "x", c="tab:red")
    top.set_ylabel(f"{y.label} at the evaluation")
    bottom.set_ylabel(f"{x.label}, final as predicted")
    bottom.set_xlabel("step")
    top.set_title("what each trial reported at its evaluations (dashed red: pruned; green: paper defaults)", fontsize=9)
    return _save(figure, path)
