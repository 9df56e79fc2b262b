"""No code above `abtune/methods/` names AB's settings: the study, promote, tracking and the reports read what
a method's settings declare (default_space, guideline, promoted_fields, schedule_fields, rank_fields,
schedule_text, spectrum_cutoff), so a second searchable or promotable method touches only its own package.

Checked with `ast` on every module of abtune outside abtune/methods/: attribute names (`config.sigma_cutoff`)
and string constants (`"method.ab_frac"`, `s["warmup_steps"]`, the text of f-strings). Docstrings are prose,
not code, and are not checked; the shipped study files are data and are not Python."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

from abtune.methods.ab.settings import AbConfig, ABSchedule
from abtune.methods.settings import MethodSettings

ROOT = Path(__file__).resolve().parent.parent / "abtune"
METHODS_DIR = ROOT / "methods"
# Names the methods' common shape owns (MethodSettings' fields, the PhaseSchedule protocol): not AB's.
SHARED = {"name", "total_steps", "segments", *MethodSettings.model_fields}
AB_NAMES = frozenset(
    {*AbConfig.model_fields, *(f.name for f in dataclasses.fields(ABSchedule)),
     *ABSchedule.from_config(AbConfig(), 300).describe(), "num_ab_steps"} - SHARED)
# (module, name) -> why it may appear there.
ALLOWED = {
    ("abtune/training/lr.py", "warmup_frac"): "train.schedule.warmup_frac, the base LR schedule's own warmup: "
                                             "a field of the run config's train section that shares AB's name",
}


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}


def named_settings(source: str, names: frozenset[str]) -> set[str]:
    """The names of `names` that `source` uses as an attribute or inside a string constant."""
    tree = ast.parse(source)
    skipped = _docstrings(tree)
    word = re.compile(r"(?<![A-Za-z0-9_])(" + "|".join(map(re.escape, sorted(names))) + r")(?![A-Za-z0-9_])")
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in names:
            found.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skipped:
            found.update(word.findall(node.value))
    return found


def test_the_checked_names_are_ab_s_settings() -> None:
    assert {"warmup_frac", "ab_frac", "rebound_frac", "lr_rebound_frac", "sigma_cutoff", "rank_cap", "sync_mode",
            "warmup_steps", "ab_steps", "rebound_steps", "lr_rebound_steps", "ab_cycles"} <= AB_NAMES
    assert not AB_NAMES & {"name", "total_steps", "segments"}


def test_no_module_above_methods_names_an_ab_setting() -> None:
    offenders = []
    for path in sorted(ROOT.rglob("*.py")):
        if METHODS_DIR in path.parents:
            continue
        module = str(path.relative_to(ROOT.parent))
        for name in sorted(named_settings(path.read_text(), AB_NAMES)):
            if (module, name) not in ALLOWED:
                offenders.append(f"{module}: {name}")
    assert not offenders, offenders


def test_the_allow_list_holds_only_what_is_still_there() -> None:
    for module, name in ALLOWED:
        assert name in named_settings((ROOT.parent / module).read_text(), AB_NAMES), (module, name)


def test_the_check_sees_attributes_keys_and_f_strings_but_not_docstrings() -> None:
    source = '''
"""The module names method.sigma_cutoff in its docstring."""
def f(config, steps):
    """And so does this function: warmup_steps."""
    cutoff = getattr(config.method, "sigma_cutoff", None)
    return config.method.rank_cap, steps["ab_steps"], f"AB x{steps['ab_cycles']}", "method.ab_frac"
'''
    assert named_settings(source, AB_NAMES) == {"sigma_cutoff", "rank_cap", "ab_steps", "ab_cycles", "ab_frac"}
    assert named_settings("x = config.sigma_cutoffs + 'ab_fraction'", AB_NAMES) == set()  # whole names only
