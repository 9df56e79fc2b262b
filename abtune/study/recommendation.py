"""The study's answer, held against DDP and stored once: which configuration to promote.

`decide` applies a rule (study/ranking.py) to the study's finished trials and holds the choice against
the DDP reference trained in the same study: the default rule keeps the trials whose top-1 is within
the margin of DDP's top-1 (seed-averaged where repeats or a confirmation exist), the least inter-node
traffic first. After `abtune study confirm` the choice is among the confirmed configurations, by their
confirmed means, against DDP's confirmed mean. The record (`Recommendation`) is stored on the study
(user attr `abtune.recommendation`) and every command reads it through `current`: `study best`,
`study status`, `promote`, `study export`, the study's MLflow run and its optuna-dashboard note. A
record is rebuilt only when the trials or the confirmation it was decided from changed, or when a
command asks for another rule (`--rule`, `--margin`), whose answer is shown and not stored.

`load(study)` returns the stored record as written (None before the first), for readers that draw it
(plots marking the recommended trial).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import optuna
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from abtune.attrs import (
    CONFIRMATION_ATTR,
    DDP,
    RECOMMENDATION_ATTR,
    RECOMMENDATION_TEXT_TAG,
    RUN_ID_ATTR,
    SEEDS_ATTR,
)
from abtune.errors import ConfigError
from abtune.objectives import OBJECTIVES
from abtune.study import dashboard_front, results
from abtune.study.importance import shown_objectives
from abtune.study.optuna_private import storage_of, study_id
from abtune.study.ranking import DEFAULT_RULE, Rule, pareto_front, promotable, rank_front, top_single
from abtune.study.spec import StudySpec

WITHIN, SHORT, NO_REFERENCE = "within", "short", "no-reference"  # how the choice stands against DDP
SEARCH, CONFIRMED = "search", "confirmed"  # what its figures are


@dataclass(frozen=True)
class Held:
    """A trial's top-1 as the recommendation compares it."""

    trial: int
    top1: float


@dataclass(frozen=True)
class Recommendation:
    """The study's current choice: trial, rule, margin, evidence and the DDP figure it was held against."""

    trial: int
    ranked: list[int]  # the rule's order (`--top K` takes the first K)
    rule: str
    margin: float
    rule_text: str  # the rule in words
    multi_objective: bool
    basis: str  # SEARCH (the search's values) or CONFIRMED (means over fresh seeds)
    seeds: int  # runs behind each figure (1: a single run)
    values: dict[str, float]  # the choice's figures by objective name (top1, inter_node_bytes, ...)
    stds: dict[str, float]  # their seed-to-seed std where measured (repeats, a confirmation)
    held: str  # WITHIN, SHORT or NO_REFERENCE
    ddp: Held | None  # DDP's top-1 in this study (its confirmed mean after a confirmation)
    closest: Held | None  # the front's highest top-1 (what a SHORT choice is compared with)
    best: dict[str, Any] | None  # {trial, values}: the front's highest top-1 when the choice is another trial
    resolution: float | None  # top-1 of one validation image (1 / images)
    spread: float | None  # seed-to-seed std of top-1 (the choice's or DDP's, the larger), when measured
    seen: dict[str, Any]  # what it was decided from: finished trials and the confirmation

    @property
    def confirmed(self) -> bool:
        return self.basis == CONFIRMED

    @property
    def promoted(self) -> int | None:
        """The trial the study recommends: None when the choice falls short of DDP (no plot rings it, no run is
        tagged recommended)."""
        return None if self.held == SHORT else self.trial

    @property
    def gap(self) -> float | None:
        """The choice's top-1 minus DDP's."""
        return None if self.ddp is None or "top1" not in self.values else self.values["top1"] - self.ddp.top1

    def evidence(self) -> str:
        """`top-1 0.9472, inter-node MB 46.88`; over seeds: `mean over 2 seeds: top-1 0.9472 ± 0.0042, ...`."""
        shown = ", ".join(f"{OBJECTIVES[k].label} {self._shown(k, v)}" for k, v in self.values.items() if k in OBJECTIVES)
        if self.confirmed:
            return f"confirmed means over {self.seeds} fresh seeds: {shown}"
        return (f"mean over {self.seeds} seeds: " if self.seeds > 1 else "") + shown

    def _shown(self, key: str, value: float) -> str:
        objective, std = OBJECTIVES[key], self.stds.get(key)
        shown = objective.show(value)
        if std is None or not math.isfinite(std):
            return shown
        return f"{shown} ± {std / objective.scale:.{objective.digits}f}"

    def lines(self, lead: str = "recommended") -> list[str]:
        """What every command prints: the choice (or why nothing is recommended), and how it stands against DDP."""
        confirmed = " (confirmed)" if self.confirmed else ""
        chosen = f"trial {self.trial}{confirmed} ({self.evidence()}), chosen by {self._why()}"
        if self.held == SHORT:
            return [self.short_line(), f"{'closest to DDP' if self._none_within() else 'chosen instead'}: {chosen}"]
        lines = [f"{lead}: {chosen}"]
        if self.held == WITHIN and self.ddp is not None:
            gap = self.gap or 0.0
            side = "above" if gap > 0 else "below"
            lines.append(f"held against DDP: top-1 {abs(gap):.4f} {side} DDP's {self.ddp.top1:.4f} (trial "
                         f"{self.ddp.trial}{', its confirmed mean' if self.confirmed else ''}), within the margin "
                         f"{self.margin:g}")
        elif self.held == NO_REFERENCE and self.multi_objective and self.closest is not None:
            lines.append(f"no DDP reference in this study: held against the front's best top-1 instead (trial "
                         f"{self.closest.trial}, {self.closest.top1:.4f}); set references.ddp: true to compare with DDP")
        return lines

    def _none_within(self) -> bool:
        assert self.ddp is not None and self.closest is not None
        return self.closest.top1 < self.ddp.top1 - self.margin - 1e-12

    def short_line(self) -> str:
        """The one line a choice short of DDP always carries."""
        assert self.ddp is not None and self.closest is not None
        if not self._none_within():  # another rule chose a trial below DDP's margin; the default rule would not
            return (f"not recommended: trial {self.trial}'s top-1 {self.values['top1']:.4f} is "
                    f"{self.ddp.top1 - self.values['top1']:.4f} below DDP's {self.ddp.top1:.4f} (trial {self.ddp.trial}), "
                    f"beyond the margin {self.margin:g}; the default rule chooses among the trials within it")
        return (f"not recommended: no trial is within {self.margin:g} top-1 of DDP's {self.ddp.top1:.4f} (trial "
                f"{self.ddp.trial}); the closest, trial {self.closest.trial} at {self.closest.top1:.4f}, is "
                f"{self.ddp.top1 - self.closest.top1:.4f} below it")

    def _why(self) -> str:
        if not self.multi_objective:
            return "one objective: the best value"
        return f"rule {self.rule_text}"

    def noise_warnings(self) -> list[str]:
        """One line when the margin is finer than what the study can resolve."""
        floors = [(self.resolution, "the top-1 of one validation image"), (self.spread, "the seed-to-seed spread")]
        finer = [f"{name} ({value:.4f})" for value, name in floors if value is not None and self.margin < value]
        if not finer or not self.multi_objective:
            return []
        return [f"warning: the margin {self.margin:g} is below {' and '.join(finer)}: trials within it cannot be "
                "told apart; raise --margin or confirm with more seeds"]

    def trade(self) -> str | None:
        """What the choice gives up against the front's highest top-1, and what it saves."""
        if self.best is None:
            return None
        others = [k for k in self.values if k != "top1" and k in OBJECTIVES and k in self.best["values"]]
        saved = ", ".join(f"{OBJECTIVES[k].label} {OBJECTIVES[k].show(self.values[k])} instead of "
                          f"{OBJECTIVES[k].show(self.best['values'][k])}" for k in others)
        return (f"the highest top-1 is trial {self.best['trial']}'s ({self.best['values']['top1']:.4f}); trial "
                f"{self.trial} has {self.values['top1']:.4f}" + (f" at {saved}" if saved else ""))

    def tags(self) -> dict[str, str]:
        """MLflow tags of the study's run."""
        tags = {"abtune.recommended_trial": str(self.trial), "abtune.recommendation.rule": self.rule,
                "abtune.recommendation.margin": f"{self.margin:g}", "abtune.recommendation.basis": self.basis,
                "abtune.recommendation.held": self.held}
        if self.gap is not None:
            tags["abtune.recommendation.top1_vs_ddp"] = f"{self.gap:+.4f}"
        return tags

    def metrics(self) -> dict[str, float]:
        """MLflow metrics of the study's run: the choice's figures as its description shows them (top-1 0.9472,
        inter-node MB 46.88), its top-1 against DDP's, and its trial number."""
        shown = {f"Recommendation/{OBJECTIVES[k].label}": round(v / OBJECTIVES[k].scale, OBJECTIVES[k].digits)
                 for k, v in self.values.items() if k in OBJECTIVES and math.isfinite(v)}
        if self.gap is not None:
            shown["Recommendation/top-1 vs DDP"] = round(self.gap, 4)
        return {"Recommendation/trial": float(self.trial), **shown}

    def markdown(self) -> str:
        """The recommendation part of the study's MLflow description and optuna-dashboard note."""
        return "\n\n".join(["## Recommendation", *self.lines(), *self.noise_warnings()]) + "\n"


# --- deciding -----------------------------------------------------------------------------------------
def decide(study: optuna.Study, rule: Rule = DEFAULT_RULE, *, search_only: bool = False) -> Recommendation | None:
    """The rule's choice among the confirmed configurations (after `study confirm`; `search_only`: never) or
    the finished trials, held against DDP; None when no trial has finished."""
    trials = every_trial(study)
    confirmed = [] if search_only else confirmed_trials(study)
    candidates = confirmed or _finished(trials)
    if not candidates:
        return None
    directions = list(study.directions)
    names = _names(study)
    top1 = names.index("top1") if "top1" in names else _first_maximized(directions)
    ddp = _ddp(study, trials, top1, bool(confirmed))
    if len(directions) == 1:
        ranked = top_single(candidates, study.direction, len(candidates), study.study_name)
        front = ranked
    else:
        front = pareto_front(candidates, directions)
        anchor = ddp.top1 if ddp is not None and rule.name == "within-margin" else None
        ranked = rank_front(front, directions, rule, anchor)
    choice = ranked[0]
    top_of_front = max(front, key=lambda t: (_top1(t, top1), -t.number)) if top1 is not None else choice
    closest = Held(top_of_front.number, _top1(top_of_front, top1)) if top1 is not None else None
    held = _held(choice, ddp, top1, rule.margin)
    values = _values(choice, names, study, bool(confirmed))
    stds = _stds(choice, values, study, bool(confirmed))
    best = None if top_of_front.number == choice.number or len(directions) == 1 else \
        {"trial": top_of_front.number, "values": _values(top_of_front, names, study, bool(confirmed))}
    return Recommendation(
        trial=choice.number, ranked=[t.number for t in ranked], rule=rule.name, margin=rule.margin,
        rule_text=rule.describe(names, "DDP's top-1" if ddp is not None else "the front's best top-1"),
        multi_objective=len(directions) > 1, basis=CONFIRMED if confirmed else SEARCH,
        seeds=_seeds(study, choice, bool(confirmed)), values=values, stds=stds, held=held, ddp=ddp, closest=closest, best=best,
        resolution=_resolution(choice), spread=_spread(study, choice, ddp, bool(confirmed)), seen=fingerprint(study))


def every_trial(study: optuna.Study, deepcopy: bool = False,
                states: tuple[TrialState, ...] | None = None) -> list[FrozenTrial]:
    """The study's trials as stored, the DDP reference included, whatever the study object shows: the runner's
    search study hides the finished DDP trial from its sampler (definition.SearchStudy), and an answer decided
    through it would hold the choice against no DDP at all."""
    return storage_of(study).get_all_trials(study_id(study), deepcopy=deepcopy, states=states)


def _finished(trials: Sequence[FrozenTrial]) -> list[FrozenTrial]:
    """Completed trials that may be recommended: promotable, within the traffic budget."""
    return [t for t in trials if t.state == TrialState.COMPLETE and promotable(t) and results.feasible(t)]


def confirmed_trials(study: optuna.Study) -> list[FrozenTrial]:
    """Promotable trials with a confirmation record, their values replaced by the confirmed means."""
    attrs = study.user_attrs
    chosen = []
    for trial in every_trial(study, deepcopy=True, states=(TrialState.COMPLETE,)):
        record = attrs.get(f"{CONFIRMATION_ATTR}.trial_{trial.number}")
        if record is not None and promotable(trial):
            trial.values = list(record["values"])
            chosen.append(trial)
    return chosen


def _names(study: optuna.Study) -> list[str]:
    return list(study.metric_names or [f"objective_{i}" for i in range(len(study.directions))])


def _first_maximized(directions: list[StudyDirection]) -> int | None:
    return directions.index(StudyDirection.MAXIMIZE) if StudyDirection.MAXIMIZE in directions else None


def _top1(trial: FrozenTrial, index: int | None) -> float:
    return float(trial.values[index]) if index is not None else float("nan")


def _ddp(study: optuna.Study, trials: Sequence[FrozenTrial], top1: int | None, confirmed: bool) -> Held | None:
    """DDP's top-1 in this study: its confirmed mean when confirmed, else its search value (a mean over repeats)."""
    reference = results.reference(trials, DDP)
    if reference is None or top1 is None:
        return None
    record = study.user_attrs.get(f"{CONFIRMATION_ATTR}.trial_{reference.number}") if confirmed else None
    value = record["values"][top1] if record is not None else reference.values[top1]
    return Held(reference.number, float(value))


def _held(choice: FrozenTrial, ddp: Held | None, top1: int | None, margin: float) -> str:
    if ddp is None or top1 is None:
        return NO_REFERENCE
    return WITHIN if _top1(choice, top1) >= ddp.top1 - margin - 1e-12 else SHORT


def _values(trial: FrozenTrial, names: list[str], study: optuna.Study, confirmed: bool) -> dict[str, float]:
    values = {n: float(v) for n, v in zip(names, trial.values, strict=True)}
    if "inter_node_bytes" not in values:  # a single objective: the traffic it sent, shown beside it
        record = study.user_attrs.get(f"{CONFIRMATION_ATTR}.trial_{trial.number}") if confirmed else None
        traffic = record["metrics"]["inter_node_bytes"]["mean"] if record else trial.user_attrs.get("inter_node_bytes")
        if traffic is not None:
            values["inter_node_bytes"] = float(traffic)
    return values


def _stds(trial: FrozenTrial, values: dict[str, float], study: optuna.Study, confirmed: bool) -> dict[str, float]:
    record = study.user_attrs.get(f"{CONFIRMATION_ATTR}.trial_{trial.number}") if confirmed else None
    stds = {}
    for key in values:
        std = record["metrics"].get(key, {}).get("std") if record else trial.user_attrs.get(f"{key}_std")
        if isinstance(std, int | float) and math.isfinite(std):
            stds[key] = float(std)
    return stds


def _seeds(study: optuna.Study, trial: FrozenTrial, confirmed: bool) -> int:
    if confirmed:
        return len(study.user_attrs[CONFIRMATION_ATTR]["seeds"])
    return max(1, len(trial.user_attrs.get(SEEDS_ATTR) or []))


def _resolution(trial: FrozenTrial) -> float | None:
    images = trial.user_attrs.get(results.VALIDATION_IMAGES)
    return 1.0 / images if images else None


def _spread(study: optuna.Study, trial: FrozenTrial, ddp: Held | None, confirmed: bool) -> float | None:
    """The larger seed-to-seed std of top-1 of the choice and of DDP, where measured."""
    numbers = [trial.number, *([ddp.trial] if ddp is not None else [])]
    by_number = {t.number: t for t in every_trial(study)}
    spreads = []
    for number in numbers:
        if confirmed:
            record = study.user_attrs.get(f"{CONFIRMATION_ATTR}.trial_{number}")
            std = record["metrics"]["top1"]["std"] if record else None
        else:
            std = by_number[number].user_attrs.get("top1_std")
        if std is not None and math.isfinite(std):
            spreads.append(float(std))
    return max(spreads) if spreads else None


def search_front(trials: Sequence[FrozenTrial], spec: StudySpec) -> list[FrozenTrial]:
    """The Pareto front of the feasible search trials on the study's shown objectives (`study best`, export)."""
    feasible = [t for t in results.search_trials(trials) if results.feasible(t)]
    return results.pareto_front(feasible, shown_objectives(spec))


# --- stored once, read everywhere ----------------------------------------------------------------------
def fingerprint(study: optuna.Study) -> dict[str, Any]:
    """What a record was decided from: the completed trials and the confirmation's time."""
    complete = [t.number for t in every_trial(study, states=(TrialState.COMPLETE,))]
    confirmation = study.user_attrs.get(CONFIRMATION_ATTR) or {}
    return {"complete": len(complete), "last": max(complete, default=-1), "confirmation": confirmation.get("time")}


def load(study: optuna.Study) -> Recommendation | None:
    """The stored recommendation as written (None before the first): for readers that only show it."""
    raw = study.user_attrs.get(RECOMMENDATION_ATTR)
    if not isinstance(raw, dict) or set(raw) != {f.name for f in fields(Recommendation)}:
        return None  # none yet, or written by another version of abtune: decided again by `current`
    held = {k: Held(**raw[k]) if raw.get(k) else None for k in ("ddp", "closest")}
    return Recommendation(**{**raw, **held})


def store(study: optuna.Study, recommendation: Recommendation) -> None:
    study.set_user_attr(RECOMMENDATION_ATTR, asdict(recommendation))


def current(study: optuna.Study, rule: Rule = DEFAULT_RULE) -> Recommendation | None:
    """The study's recommendation: the stored record while it is up to date, else decided again and stored.
    Another rule than the default is decided for the asking command and not stored."""
    stored = load(study)
    if rule != DEFAULT_RULE:
        return decide(study, rule)
    if stored is not None and stored.rule == rule.name and stored.margin == rule.margin and \
            stored.seen == fingerprint(study):
        return stored
    fresh = decide(study, rule)
    if fresh is not None:
        store(study, fresh)
    return fresh


def top(study: optuna.Study, recommendation: Recommendation, count: int) -> list[int]:
    """The first `count` trials of the recommendation's ranking; one clear line when there are fewer."""
    if count < 1:
        raise ConfigError(f"--top must be at least 1, got {count}")
    if count > len(recommendation.ranked):
        name = study.study_name
        if recommendation.confirmed:
            raise ConfigError(f"--top {count}: study '{name}' has only {len(recommendation.ranked)} confirmed "
                              "configuration(s) on its front (ddp excluded); ask for fewer or confirm more with "
                              f"`abtune study confirm {name} --top {count}`")
        if recommendation.multi_objective:
            raise ConfigError(f"--top {count}: the Pareto front of study '{name}' holds only "
                              f"{len(recommendation.ranked)} trial(s); ask for fewer")
        raise ConfigError(f"--top {count}: study '{name}' has only {len(recommendation.ranked)} finished trial(s) "
                          "(ddp trials excluded); ask for fewer")
    return recommendation.ranked[:count]


def require(study: optuna.Study, rule: Rule = DEFAULT_RULE) -> Recommendation:
    """`current`, or one line saying why the study has no recommendation yet."""
    found = current(study, rule)
    if found is None:
        trials = every_trial(study)
        counts = ", ".join(f"{sum(t.state.name == s for t in trials)} {s.lower()}"
                           for s in sorted({t.state.name for t in trials})) or "it has no trials at all"
        raise ConfigError(f"study '{study.study_name}' has no finished trials ({counts}); "
                          "run the study first or choose another one")
    return found


# --- shown beside the study ----------------------------------------------------------------------------
def publish(study: optuna.Study, recommendation: Recommendation | None, tracking: Any, run_id: str | None) -> None:
    """The recommendation on the study's MLflow run (tags, metrics, the answer in its description, the
    recommended trial's run tagged), as its optuna-dashboard note, and ringed on the dashboard's front in MB
    (study/dashboard_front.py). Called wherever the record may have
    changed (a study run's plot updates and its end, a confirmation): each then reads as `study best` prints."""
    if recommendation is None:
        return
    trials = every_trial(study)
    chosen = next((t.user_attrs.get(RUN_ID_ATTR) for t in trials if t.number == recommendation.promoted), None)
    tracking.show_recommendation(run_id, {**recommendation.tags(), RECOMMENDATION_TEXT_TAG: recommendation.markdown()},
                                 recommendation.metrics(), chosen, step=recommendation.seen["complete"])
    try:
        import optuna_dashboard
    except ImportError:  # the dashboard is optional
        return
    optuna_dashboard.save_note(study, recommendation.markdown())
    dashboard_front.save(study, trials, recommendation.promoted)
