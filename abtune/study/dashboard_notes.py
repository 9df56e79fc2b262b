"""What optuna-dashboard shows of a finished trial, in the units a person reads.

The dashboard lists a trial's user attributes as they are stored (bytes, 17-digit floats) and its note,
if any, as markdown. So each finished trial gets `inter_node_mb` (its traffic in MB, two decimals) beside
`inter_node_bytes`, and a note: what the trial is (a reference trial says which), its result, and its
parameters rounded for reading (the stored values keep full precision).
"""

from __future__ import annotations

from typing import Any

import optuna

from abtune.attrs import DDP, PAPER_DEFAULTS, REFERENCE_ATTR
from abtune.prose import readable

MEGA = 1e6
REFERENCE_TEXT = {DDP: "**DDP reference**: plain DDP in the search's layout, outside the search space; the "
                       "traffic every other trial is measured against.",
                  PAPER_DEFAULTS: "**Paper defaults**: the AB paper's guideline configuration, inside the search space."}


def readable_attrs(attrs: dict[str, Any]) -> dict[str, float]:
    """The traffic in MB (two decimals), to store beside the bytes."""
    nbytes = attrs.get("inter_node_bytes")
    return {} if nbytes is None else {"inter_node_mb": round(nbytes / MEGA, 2)}


def trial_note(number: int, params: dict[str, Any], attrs: dict[str, Any]) -> str:
    lines = [f"## Trial {number}"]
    reference = attrs.get(REFERENCE_ATTR)
    if reference in REFERENCE_TEXT:
        lines.append(REFERENCE_TEXT[reference])
    result = []
    if attrs.get("top1") is not None:
        result.append(f"top-1 **{attrs['top1']:.4f}**")
    if attrs.get("inter_node_bytes") is not None:
        result.append(f"training inter-node **{attrs['inter_node_bytes'] / MEGA:,.2f} MB** per rank")
    if attrs.get("compression") is not None:
        result.append(f"compression **{attrs['compression']:.2f}:1**")
    if result:
        lines.append("Result: " + ", ".join(result) + ".")
    if params:
        lines.append("| parameter | value |\n|---|---|\n" + "\n".join(f"| {k} | {readable(v)} |" for k, v in params.items()))
    return "\n\n".join(lines)


def annotate(trial: optuna.Trial, attrs: dict[str, Any]) -> None:
    """Store the readable attributes and the note on a trial about to be told its result."""
    from optuna_dashboard import save_note

    for key, value in readable_attrs(attrs).items():
        trial.set_user_attr(key, value)
    save_note(trial, trial_note(trial.number, trial.params, {**trial.user_attrs, **attrs}))
