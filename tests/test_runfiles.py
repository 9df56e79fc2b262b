"""The run folder's contract (abtune.runfiles) and the method capabilities the layers above
`abtune/methods/` ask instead of naming a method (issue 16). What a real run's folder holds is read in
tests/test_training_distributed.py, from the AB run it trains once for both."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from abtune.config import parse_run_config
from abtune.errors import ConfigError
from abtune.methods import METHOD_CONFIGS, METHOD_NAMES, METHODS
from abtune.methods.ab.settings import AbConfig
from abtune.methods.base import Method
from abtune.runfiles import read_summary

ABTUNE = Path(__file__).parent.parent / "abtune"
# TODO(issue 16): files being rewritten in parallel; the coordinator empties this when merging.
PENDING: set[str] = set()


def test_a_folder_without_a_summary_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"{tmp_path} holds no summary.json"):
        read_summary(tmp_path)


@pytest.mark.parametrize("name", METHOD_NAMES)
def test_every_registered_method_parses_to_its_settings_and_names_its_method(name: str) -> None:
    """One registry line per method: the run config's `method:` section and the trainer both follow it."""
    settings, path = METHODS[name]
    assert type(parse_run_config({"method": {"name": name}}).method) is settings
    module, cls = path.split(":")
    assert issubclass(getattr(importlib.import_module(module), cls), Method)


@pytest.mark.parametrize("name", sorted(METHOD_CONFIGS))
def test_method_capabilities(name: str) -> None:
    config = METHOD_CONFIGS[name](name=name)
    is_ab = isinstance(config, AbConfig)
    assert (bool(config.promoted_fields), bool(config.guideline)) == (is_ab, is_ab)
    schedule = config.phase_schedule(300)
    assert (schedule is not None) is is_ab
    if schedule is not None:
        assert schedule.segments[0].start == 0 and schedule.segments[-1].end == 300
    config.check_layout(4, 2, 2)  # two nodes of two ranks: every method runs


def test_only_grouped_ab_checks_its_groups_against_the_layout() -> None:
    with pytest.raises(ConfigError, match="AB's groups would straddle nodes"):
        AbConfig(group_size=3).check_layout(6, 2, 3)
    with pytest.raises(ConfigError, match="needs at least 2 ranks"):
        AbConfig().check_layout(1, 1, 1)
    AbConfig(name="ab-nogroups").check_layout(1, 1, 1)
    assert AbConfig().derived_params(300, 2)["group_size"] == 2
    assert "group_size" not in AbConfig(name="ab-nogroups").derived_params(300, 2)


def _sources() -> list[tuple[str, str]]:
    return [(p.relative_to(ABTUNE).as_posix(), p.read_text()) for p in sorted(ABTUNE.rglob("*.py"))]


def test_method_names_stay_in_the_methods_and_their_configs() -> None:
    named = [path for path, text in _sources() if '"ab-nogroups"' in text
             and not path.startswith("methods/") and path != "config.py" and path not in PENDING]
    assert named == []


def test_run_folder_file_names_have_one_home() -> None:
    literal = re.compile(r'"(summary\.json|config\.yaml|metrics\.jsonl|hooks\.yaml|outcome\.json)"')
    named = [path for path, text in _sources() if literal.search(text) and path != "runfiles.py"
             and path not in PENDING | {"training/hooks.py"}]
    assert named == []
