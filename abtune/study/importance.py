"""Which searched parameters mattered: Optuna's importances per objective, and parameters that changed nothing.

Importances are Optuna's own (`optuna.importance.get_param_importances`, its default evaluator fANOVA,
seeded), one set per objective, over the completed search trials (the paper-defaults reference included, DDP not).
They need two such trials and a searched parameter that took two values; an objective that was the
same in every trial (or finite in fewer than two) gets none: Optuna would share it out equally, as
if every parameter mattered alike. Each importance carries a p-value against a permutation baseline
(`against_shuffled`): a few trials give every parameter about 1/P of the credit whatever drove the
results, and such importances are indistinguishable from shuffled values, not a ranking.

A searched parameter is **inert** when it took at least two distinct values among those trials and
the quantity it drives was the same in every one of them:

- a field its method's settings list in `rank_fields`: the ranks chosen at the first decomposition
  (trial attribute `first_ranks`) and the trained model's compression;
- a field listed in `schedule_fields`: the method's schedule in steps (`schedule_steps`; fractions
  round to whole steps);
- any other parameter: every objective's value.

An inert parameter is searched in vain: its value in the best trial says nothing, and promoting it
carries an untested value to the scaling runs.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial

from abtune.attrs import ANALYSIS_ATTR, FIRST_RANKS_ATTR, SCHEDULE_ATTR, SPEC_ATTR
from abtune.methods import declaring
from abtune.methods.settings import MethodSettings
from abtune.objectives import OBJECTIVES
from abtune.study import results
from abtune.study.spec import StudySpec, parse_study_spec

PERMUTATIONS = 19  # shufflings of an objective's values: the baseline an importance must beat (p <= 0.05)
SIGNIFICANT = 0.05  # an importance's p-value against the shuffled baseline


@dataclass(frozen=True)
class InertParameter:
    name: str
    values: tuple[Any, ...]  # the distinct values it took, sorted
    what: str  # what stayed the same, in words

    def describe(self) -> str:
        taken = (f"{len(self.values)} values in [{_short(self.values[0])}, {_short(self.values[-1])}]"
                 if all(isinstance(v, int | float) for v in self.values) else f"the values {', '.join(map(str, self.values))}")
        return f"{self.name} changed nothing: it took {taken} but {self.what}"


def inert_parameters(trials: Sequence[FrozenTrial], space: Sequence[str], objectives: Sequence[str]) -> list[InertParameter]:
    """The searched parameters under which the search trials' results did not change (see the module)."""
    searched = results.search_trials(trials)
    inert = []
    for name in space:
        ran = [t for t in searched if name in t.params]
        values = sorted({t.params[name] for t in ran}, key=_sortable)
        if len(values) < 2:
            continue
        driven, what = _driven(name, objectives)
        seen = [driven(t) for t in ran]
        if any(value is None for value in seen):
            continue  # trials from before abtune recorded the quantity: nothing to judge by
        if len({_frozen(value) for value in seen}) == 1:
            inert.append(InertParameter(name, tuple(values), what(ran[0])))
    return inert


def _driven(name: str, objectives: Sequence[str]) -> tuple[Callable[[FrozenTrial], Any], Callable[[FrozenTrial], str]]:
    """How to read the quantity `name` drives from a trial, and how to say that it stayed the same."""
    if declaring(name, "rank_fields") is not None:
        return (lambda t: (t.user_attrs[FIRST_RANKS_ATTR], round(float(t.user_attrs["compression"]), 4))
                if FIRST_RANKS_ATTR in t.user_attrs and "compression" in t.user_attrs else None,
                lambda t: _same_ranks(t))
    if (settings := declaring(name, "schedule_fields")) is not None:
        return (lambda t: t.user_attrs.get(SCHEDULE_ATTR),
                lambda t: f"every trial ran the same schedule in steps ({_schedule(settings, t.user_attrs.get(SCHEDULE_ATTR))})")
    return (lambda t: tuple(t.user_attrs[o] for o in objectives) if all(o in t.user_attrs for o in objectives) else None,
            lambda t: f"every trial had the same {', '.join(objectives)}")


def _same_ranks(trial: FrozenTrial) -> str:
    ranks = trial.user_attrs.get(FIRST_RANKS_ATTR) or {}
    factored = "factored nothing" if not ranks else f"factored the same {len(ranks)} weight(s) at the same ranks"
    return f"every trial {factored} (compression {float(trial.user_attrs['compression']):.2f}:1)"


def _schedule(settings: type[MethodSettings], steps: dict[str, int] | None) -> str:
    return settings.schedule_text(steps) if steps else "none recorded"


def importances(trials: Sequence[FrozenTrial], objectives: Sequence[str]) -> dict[str, dict[str, float]]:
    """Optuna's parameter importances for each objective (read from the trials' result attributes); an
    objective `unranked` gives a reason for is left out.

    Raises ValueError when there are too few search trials or no searched parameter took two values.
    """
    searched = _with_params(trials)
    if len(searched) < 2:
        raise ValueError(f"{len(searched)} completed search trial(s): importances need at least 2")
    names = {name for t in searched for name in t.params}
    if not any(len({_frozen(t.params[n]) for t in searched if n in t.params}) > 1 for n in names):
        raise ValueError(f"no searched parameter took two values in the {len(searched)} completed search trials")
    by_objective: dict[str, dict[str, float]] = {}
    for objective in objectives:
        if unranked(trials, objective) is not None:
            continue
        scored = [t for t in searched if _finite(t.user_attrs.get(objective))]
        by_objective[objective] = _importances_of(scored, [float(t.user_attrs[objective]) for t in scored], objective)
    return by_objective


def _importances_of(trials: Sequence[FrozenTrial], values: Sequence[float], objective: str) -> dict[str, float]:
    """Optuna's importances (fANOVA, seeded) of the trials' parameters for `values`, one per trial."""
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "new study created in memory" line per objective
    try:
        copy = optuna.create_study(direction=OBJECTIVES[objective].direction)
        copy.add_trials([optuna.trial.create_trial(params=t.params, distributions=t.distributions, value=v)
                         for t, v in zip(trials, values, strict=True)])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # experimental-feature notes of the evaluator
            evaluator = optuna.importance.FanovaImportanceEvaluator(seed=0)
            return dict(optuna.importance.get_param_importances(copy, evaluator=evaluator))
    finally:
        optuna.logging.set_verbosity(verbosity)


def against_shuffled(trials: Sequence[FrozenTrial], observed: dict[str, dict[str, float]],
                     permutations: int = PERMUTATIONS) -> dict[str, dict[str, float]]:
    """Each importance's p-value against a permutation baseline: the share of `permutations` shufflings of the
    objective's values over the trials (parameters kept) that credit the parameter at least as much, counting
    the observed one; with 19 shufflings p <= 0.05 only when it beats every one of them. A shuffling that repeats
    an earlier one (three trials have six orders) reuses its fit: the evaluator is seeded, the same values in the
    same order give the same importances."""
    searched = _with_params(trials)
    shuffle = random.Random(0).shuffle
    p_values: dict[str, dict[str, float]] = {}
    for objective, by_param in observed.items():
        scored = [t for t in searched if _finite(t.user_attrs.get(objective))]
        values = [float(t.user_attrs[objective]) for t in scored]
        beaten = dict.fromkeys(by_param, 0)
        fitted: dict[tuple[float, ...], dict[str, float]] = {}
        for _ in range(permutations):
            shuffled = list(values)
            shuffle(shuffled)
            if (order := tuple(shuffled)) not in fitted:
                fitted[order] = _importances_of(scored, shuffled, objective)
            null = fitted[order]
            for param, importance in by_param.items():
                beaten[param] += null.get(param, 0.0) >= importance
        p_values[objective] = {p: (1 + n) / (1 + permutations) for p, n in beaten.items()}
    return p_values


def unranked(trials: Sequence[FrozenTrial], objective: str) -> str | None:
    """Why the search trials rank no parameter for `objective` (None: they can)."""
    values = [float(t.user_attrs[objective]) for t in _with_params(trials) if _finite(t.user_attrs.get(objective))]
    if len(values) < 2:
        return f"{len(values)} search trial(s) with a finite {objective}"
    if len(set(values)) == 1:
        return f"every search trial had the same {objective}"
    return None


def _with_params(trials: Sequence[FrozenTrial]) -> list[FrozenTrial]:
    return [t for t in results.search_trials(trials) if t.params]


def inert_in_study(study: optuna.Study) -> list[InertParameter]:
    """The inert parameters of a stored study: its searched space and objectives when `abtune study create`
    made it, else every parameter of its trials against top-1 and inter-node bytes."""
    trials = study.get_trials(deepcopy=False)
    raw = study.user_attrs.get(SPEC_ATTR)
    if raw is not None:
        spec = parse_study_spec(raw, f"study {study.study_name}")
        return inert_parameters(trials, list(spec.space), shown_objectives(spec))
    space = sorted({name for t in trials for name in t.params})
    return inert_parameters(trials, space, ["top1", "inter_node_bytes"])


def shown_objectives(spec: StudySpec) -> list[str]:
    """The objectives a study's reports show: its own, or top-1 and inter-node bytes for a single objective."""
    return list(spec.objectives) if spec.multi_objective else ["top1", "inter_node_bytes"]


def analysis(trials: Sequence[FrozenTrial], space: Sequence[str], objectives: Sequence[str]) -> dict[str, Any]:
    """Importances (or why there are none yet) and inert parameters, as JSON for an artifact."""
    report: dict[str, Any] = {"objectives": list(objectives), "search_trials": len(_with_params(trials)),
                              "inert": [{"param": p.name, "values": list(p.values), "message": p.describe()}
                                        for p in inert_parameters(trials, space, objectives)]}
    try:
        report["importances"] = importances(trials, objectives) or None
    except (ValueError, RuntimeError) as error:  # too few trials, or no parameter that varies
        report["importances"] = None
        report["importances_missing"] = str(error).splitlines()[0][:200]
        return report
    if report["importances"] is not None:
        report["p_values"] = against_shuffled(trials, report["importances"])
        report["permutations"] = PERMUTATIONS
        report["significant_p"] = SIGNIFICANT
    skipped = {o: reason for o in objectives if (reason := unranked(trials, o)) is not None}
    if skipped:
        report["importances_skipped"] = skipped  # objectives left out of the importances, and why
    if report["importances"] is None:
        report["importances_missing"] = "; ".join(skipped.values())
    return report


def study_analysis(storage: BaseStorage, study_id: int, trials: Sequence[FrozenTrial], space: Sequence[str],
                   objectives: Sequence[str], *, keep: bool = False) -> dict[str, Any]:
    """`analysis` of a stored study's trials: the one the study holds when it was computed from the same search
    trials, space and objectives (40 forests fewer: seconds of CPU), else computed now; `keep` stores what is
    computed in the study (the runner does, after every rebuild of its plots) for the next reader."""
    inputs = _analysis_inputs(trials, space, objectives)
    held = storage.get_study_system_attrs(study_id).get(ANALYSIS_ATTR)
    if isinstance(held, dict) and held.get("inputs") == inputs:
        return dict(held["analysis"])
    report = analysis(trials, space, objectives)
    if keep:
        storage.set_study_system_attr(study_id, ANALYSIS_ATTR, {"inputs": inputs, "analysis": report})
    return report


def _analysis_inputs(trials: Sequence[FrozenTrial], space: Sequence[str], objectives: Sequence[str]) -> str:
    """A digest of everything `analysis` reads: the search trials' parameters, their ranges and every result
    attribute, the space, the objectives and the number of shufflings."""
    read = [[t.number, t.params, {n: repr(d) for n, d in t.distributions.items()}, t.user_attrs]
            for t in results.search_trials(trials)]
    text = json.dumps([list(space), list(objectives), PERMUTATIONS, read], sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _sortable(value: Any) -> tuple[int, Any]:
    return (0, value) if isinstance(value, int | float) else (1, str(value))


def _frozen(value: Any) -> Any:
    """A hashable form of attribute values (dicts and lists, as JSON storages return them)."""
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    return value
