"""Creating and deleting studies. Everything is validated before the storage is opened, so a bad
study file leaves no trace (not even an empty SQLite file)."""

from __future__ import annotations

import shutil
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage

from abtune.attrs import ATTEMPT_ATTR, DDP, PAPER_DEFAULTS, REFERENCE_ATTR, SPEC_ATTR, STUDY_DIR_ATTR
from abtune.errors import ConfigError
from abtune.methods import METHOD_CONFIGS
from abtune.redact import redact
from abtune.study.definition import build_pruner, build_sampler, name_objectives, stored_study_dir
from abtune.study.space import build_distributions, paper_default_params
from abtune.study.spec import StudySpec, load_study_spec, parse_study_spec
from abtune.study.storage import absolute_url, open_storage

DEFAULT_STUDIES_DIR = Path("runs") / "studies"
WINNER_WAIT_S = 10  # a concurrent `study create` records its definition right after creating the study


def validate(spec: StudySpec, source: str) -> dict[str, Any] | None:
    """Every check that needs no storage; returns the paper-defaults parameters (None when not enqueued)."""
    if not spec.space:
        raise ConfigError(f"{source}: space: empty, and method {spec.base['method']['name']!r} declares no default "
                          "search space; list the fields to search under space:")
    distributions = build_distributions(spec, source)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", FutureWarning)
            build_sampler(spec)
            build_pruner(spec)
    except ConfigError as error:
        raise ConfigError(f"{source}: {error}") from None
    for warning in caught:  # Optuna's deprecations of an option, once and on one line each
        if issubclass(warning.category, FutureWarning):
            print(f"abtune: warning: {source}: {' '.join(str(warning.message).split())}", file=sys.stderr)
    references = int(spec.references.paper_defaults) + int(spec.references.ddp)
    if spec.trials <= references:
        raise ConfigError(f"{source}: trials: {spec.trials} leaves no trial for the search after the "
                          f"{references} reference trials; set trials above {references}")
    eval_every = spec.base["train"]["eval_every"]
    if spec.pruner.name != "none" and eval_every is not None and eval_every >= spec.base["train"]["steps"]:
        raise ConfigError(f"{source}: pruner {spec.pruner.name} needs evaluations during a run: set "
                          f"train.eval_every below train.steps ({spec.base['train']['steps']}), got {eval_every}")
    if not spec.references.paper_defaults:
        return None
    base_method = spec.base["method"]["name"]
    if not METHOD_CONFIGS[base_method].guideline:
        known = [name for name, cls in METHOD_CONFIGS.items() if cls.guideline]
        raise ConfigError(f"{source}: references.paper_defaults needs an AB method in the base config "
                          f"(method.name: {known[0]}), got {base_method}; or set it to false")
    return paper_default_params(spec, distributions, source)


def create(path: Path, name: str | None, url: str, force: bool,
           warm_start: optuna.Study | None = None) -> tuple[str, bool]:
    """Create the study from a study file; returns (name, created). An identical study is left as is.
    `warm_start`: a finished study whose picks and front are enqueued first (study/warm.py)."""
    spec = load_study_spec(path)
    name = name or spec.name or path.stem
    spec = parse_study_spec({**spec.model_dump(mode="json"), "name": name}, str(path))
    paper_params = validate(spec, str(path))
    storage = open_storage(url, create=True)
    if _exists(storage, name):
        if not storage.get_all_trials(storage.get_study_id_from_name(name)):  # perhaps being created right now
            _await_definition(storage, name, url)
        if _same_definition(storage, name, spec):
            return name, False
        if _same_definition(storage, name, spec, but_budget=True):  # a new budget: the trials stay
            set_budget(storage, name, spec.trials)
            return name, False
        if not force:
            raise ConfigError(f"study {name!r} already exists in {redact(absolute_url(url))} with a different "
                              "definition; pass --force to replace it (its trials are deleted) or choose --name")
        delete(storage, name)
    study_dir = Path(spec.study_dir or DEFAULT_STUDIES_DIR / name).resolve()
    try:
        study = optuna.create_study(study_name=name, storage=storage, directions=spec.directions)
    except optuna.exceptions.DuplicatedStudyError:  # another `study create` of this name won the race
        _await_definition(storage, name, url)
        if _same_definition(storage, name, spec):
            return name, False
        raise ConfigError(f"study {name!r} was created in {redact(absolute_url(url))} at the same moment by another "
                          "process, with a different definition; pass --force to replace it (its trials are "
                          "deleted) or choose --name") from None
    name_objectives(study, spec)
    stored = spec.model_dump(mode="json")
    stored["storage"] = redact(stored["storage"]) if stored["storage"] else None
    study.set_user_attr(SPEC_ATTR, stored)
    study.set_user_attr(STUDY_DIR_ATTR, str(study_dir))
    if warm_start is not None:
        from abtune.study import warm

        warm.enqueue(study, warm_start, build_distributions(spec, str(path)), [paper_params] if paper_params else [])
    if paper_params is not None:
        study.enqueue_trial(paper_params, user_attrs={REFERENCE_ATTR: PAPER_DEFAULTS, ATTEMPT_ATTR: 0})
    if spec.references.ddp:
        study.enqueue_trial({}, user_attrs={REFERENCE_ATTR: DDP, ATTEMPT_ATTR: 0})
    return name, True


def _await_definition(storage: BaseStorage, name: str, url: str) -> None:
    """Wait until the process that created `name` has recorded its definition (its next write)."""
    deadline = time.monotonic() + WINNER_WAIT_S
    while SPEC_ATTR not in storage.get_study_user_attrs(storage.get_study_id_from_name(name)):
        if time.monotonic() > deadline:
            raise ConfigError(f"study {name!r} in {redact(absolute_url(url))} was created by another process that "
                              f"recorded no definition within {WINNER_WAIT_S} s; if that process was stopped, "
                              f"replace the study with --force")
        time.sleep(0.1)


def _exists(storage: BaseStorage, name: str) -> bool:
    try:
        storage.get_study_id_from_name(name)
    except KeyError:
        return False
    return True


def _same_definition(storage: BaseStorage, name: str, spec: StudySpec, but_budget: bool = False) -> bool:
    attrs = storage.get_study_user_attrs(storage.get_study_id_from_name(name))
    if SPEC_ATTR not in attrs:
        return False
    stored, wanted = parse_study_spec(attrs[SPEC_ATTR], name).definition(), spec.definition()
    if but_budget:
        stored["trials"] = wanted["trials"]
    return stored == wanted


def budget(storage: BaseStorage, name: str) -> int:
    return int(storage.get_study_user_attrs(storage.get_study_id_from_name(name))[SPEC_ATTR]["trials"])


def set_budget(storage: BaseStorage, name: str, trials: int) -> None:
    """The study's trial budget (reference trials included) becomes `trials`; every trial is kept. A budget
    below the trials already counted leaves nothing to run (the next `study run` says so)."""
    study_id = storage.get_study_id_from_name(name)
    stored = dict(storage.get_study_user_attrs(study_id)[SPEC_ATTR])
    storage.set_study_user_attr(study_id, SPEC_ATTR, {**stored, "trials": trials})


def add_trials(storage: BaseStorage, name: str, count: int) -> tuple[int, int]:
    """Raise the study's budget by `count` trials, keeping every trial; returns (old, new) budget."""
    if count < 1:
        raise ConfigError(f"--add-trials must be at least 1, got {count}")
    old = budget(storage, name)
    set_budget(storage, name, old + count)
    return old, old + count


def delete(storage: BaseStorage, name: str) -> Path | None:
    """Delete the study and its trial folders (their numbers would clash with a new study's)."""
    study_id = storage.get_study_id_from_name(name)
    study_dir = stored_study_dir(storage, study_id) if STUDY_DIR_ATTR in storage.get_study_user_attrs(study_id) else None
    storage.delete_study(study_id)
    if study_dir is not None and study_dir.exists():
        shutil.rmtree(study_dir)
    return study_dir
