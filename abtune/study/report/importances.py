"""Optuna's parameter importances per objective as `study best` prints them, and the searched parameters
that changed nothing."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from abtune import tables
from abtune.study.importance import SIGNIFICANT


def _cell(importance: float, p_value: float | None) -> str:
    return f"{importance:.3f}" + ("" if p_value is None else f" (p {p_value:.2f})")


def print_importances(console: Console, analysis: dict[str, Any]) -> None:
    """Optuna's parameter importances per objective, then one line per searched parameter that changed nothing."""
    values = analysis["importances"]
    if values is None:
        console.print(f"parameter importances: not yet ({analysis['importances_missing']})")
    else:
        objectives = list(values)
        params = sorted({p for by in values.values() for p in by}, key=lambda p: -max(by.get(p, 0.0) for by in values.values()))
        inert = {i["param"] for i in analysis["inert"]}  # Optuna may credit one with what a correlated parameter did
        p_values = analysis.get("p_values") or {}
        rows = [[param + (" (changed nothing)" if param in inert else ""),
                 *(_cell(values[o].get(param, 0.0), p_values.get(o, {}).get(param)) for o in objectives)]
                for param in params]
        columns = [tables.Column("parameter", justify="left", wrap=True),
                   *(tables.Column(o, justify="left") for o in objectives)]
        against = (f"; p: against {analysis['permutations']} shufflings of the objective's values"
                   if p_values else "")
        tables.print_table(console, "parameter importances (Optuna's default evaluator, per objective, over "
                           f"{analysis['search_trials']} search trials{against})", columns, rows)
        for objective, by_param in p_values.items():
            if all(p > SIGNIFICANT for p in by_param.values()):
                console.print(f"parameter importances for {objective}: indistinguishable from shuffled values (no "
                              f"p <= {SIGNIFICANT}); {analysis['search_trials']} trials rank no parameter")
        for objective, reason in analysis.get("importances_skipped", {}).items():
            console.print(f"parameter importances for {objective}: none ({reason})")
    for inert in analysis["inert"]:
        console.print(f"warning: {inert['message']}")
