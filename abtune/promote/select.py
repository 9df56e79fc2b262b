"""Which trials of a study are promoted, and what they carry.

A promoted configuration carries only the settings that transfer between scales: those its method's
settings declare (`promoted_fields`; never absolute step counts, batch sizes or the model). Trial
params are named by dotted run-config keys (`method.FIELD`). The `ddp` reference trial (user attr
`reference: ddp`) and trials of methods that declare nothing promotable are never promoted: the DDP
baseline is planned for every node count anyway. The `paper-defaults` reference competes like any other trial.

What is promoted is the study's recommendation (study/recommendation.py), the record `study best` and
`study status` print: after `abtune study confirm` it chooses among the confirmed configurations by their
confirmed means, and promotion shows their intervals.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from abtune.attrs import CONFIRMATION_ATTR, RUN_ID_ATTR, SEEDS_ATTR
from abtune.methods import declared_keys
from abtune.study import recommendation
from abtune.study.importance import inert_in_study
from abtune.study.ranking import DEFAULT_RULE, Rule

# what a promoted trial carries: its method and what the methods declare promotable (their promoted_fields)
PROMOTED_KEYS = ("method.name", *declared_keys("promoted_fields"))


@dataclass(frozen=True)
class Source:
    study: str
    trial: int
    values: tuple[float, ...]
    mlflow_run_id: str | None = None
    confirmed: str | None = None  # the confirmed interval, when `abtune study confirm` ran

    def describe(self) -> str:
        run = f", mlflow {self.mlflow_run_id}" if self.mlflow_run_id else ""
        return f"{self.study} #{self.trial}{run}"


@dataclass(frozen=True)
class Promoted:
    """One configuration to scale: its name, the dotted overrides it carries, and where it came from."""

    name: str
    overrides: dict[str, Any]
    source: Source | None = None
    dropped: tuple[str, ...] = field(default=())  # trial params that do not transfer to the target


def promoted_from_study(study: optuna.Study, top: int, rule: Rule = DEFAULT_RULE) -> list[Promoted]:
    """The adapter from a study: the first K of its recommendation (study/recommendation.py: its confirmed
    configurations by their confirmed means after `abtune study confirm`, else its finished trials)."""
    answer = recommendation.require(study, rule)
    by_number = {t.number: t for t in study.get_trials(deepcopy=False)}
    if not answer.confirmed:
        return [promote_trial(study.study_name, by_number[n]) for n in recommendation.top(study, answer, top)]
    return [promote_trial(study.study_name, by_number[n], _interval_text(study, n),
                          study.user_attrs[f"{CONFIRMATION_ATTR}.trial_{n}"]["values"])
            for n in recommendation.top(study, answer, top)]


def chosen_by(study: optuna.Study, promoted: list[Promoted], rule: Rule) -> str:
    """Which trials are promoted, then the recommendation's lines as `abtune study best` prints them."""
    answer = recommendation.require(study, rule)
    trials = ", ".join(f"trial {p.source.trial}" for p in promoted if p.source is not None)
    basis = " (their confirmed means)" if answer.confirmed else ""
    why = "one objective, the best value first" if not answer.multi_objective else f"chosen by rule {answer.rule_text}"
    lines = answer.lines() if answer.held == recommendation.SHORT else answer.lines()[1:]
    return "\n".join([f"promoting {trials} of study {study.study_name}{basis}, {why}", *lines])


def selection_basis(study: optuna.Study) -> str | None:
    """None when the study is confirmed, else one line on what the selection rests on and how to confirm it."""
    if CONFIRMATION_ATTR in study.user_attrs:
        return None
    seeds = max((len(t.user_attrs.get(SEEDS_ATTR, [])) for t in study.get_trials(deepcopy=False)), default=0)
    basis = f"{seeds} seeds" if seeds > 1 else "a single run"
    return (f"the selection from study {study.study_name} rests on {basis} per configuration, not on a "
            f"confirmation; run `abtune study confirm {study.study_name} --top K --seeds 5` first")


def _interval_text(study: optuna.Study, number: int) -> str:
    record = study.user_attrs[f"{CONFIRMATION_ATTR}.trial_{number}"]
    top1 = record["metrics"]["top1"]
    return f"top-1 {top1['mean']:.4f} [{top1['low']:.4f}, {top1['high']:.4f}] over {len(top1['values'])} seeds"


def promote_trial(study_name: str, trial: FrozenTrial, confirmed: str | None = None,
                  values: Sequence[float] | None = None) -> Promoted:
    """`trial` as a configuration to scale; `values`: its confirmed means, when confirmed."""
    carried = {k: v for k, v in trial.params.items() if k in PROMOTED_KEYS}
    dropped = tuple(sorted(k for k in trial.params if k not in PROMOTED_KEYS))
    source = Source(study_name, trial.number, tuple(trial.values or () if values is None else values),
                    trial.user_attrs.get(RUN_ID_ATTR), confirmed)
    return Promoted(f"trial-{trial.number}", carried, source, dropped)


def inert_carried(study: optuna.Study, promoted: list[Promoted]) -> list[str]:
    """One line per promoted value of a parameter under which the study's results did not change."""
    inert = {p.name: p for p in inert_in_study(study)}
    lines = []
    for item in promoted:
        for key, value in item.overrides.items():
            if key in inert:
                shown = f"{value:.4g}" if isinstance(value, float) else str(value)
                lines.append(f"promote: {key}={shown} changed nothing in study {study.study_name}: "
                             f"{inert[key].what}; its value in the scaling runs is untested")
    return lines


def load_study(name: str, url: str) -> optuna.Study:
    """A study from the storage `abtune study` uses; one clear line when it is not there."""
    from abtune.study.storage import open_storage, require_study

    storage = open_storage(url)
    require_study(storage, name, url)
    return optuna.load_study(study_name=name, storage=storage)
