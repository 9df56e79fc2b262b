"""The import graph: every arrow points down the layers of DESIGN.md, and no modules import each other in a circle.

Drawn from the source with `ast`: every `import abtune...` and `from abtune... import` in a module, at its top
or inside a function (a lazy import is still an arrow), except under `if TYPE_CHECKING:` (annotations only).
No circle either way: with the annotation-only imports counted too (`import_graph(annotations=True)`), no two modules know each other.
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "abtune"

# Higher imports lower. Modules not named here are leaves (config, errors, phases, runfiles, schema, ...):
# every layer may read them, and they import only other leaves.
LAYERS = {
    "abtune.cli": 10,
    "abtune.ui": 9, "abtune.compare": 9, "abtune.promote": 9,
    "abtune.study": 8,
    "abtune.runs": 7, "abtune.rundir": 7,
    "abtune.launch": 6,
    "abtune.tracking": 5.5,  # called by the runs and the study; the training loop reaches it through a hook spec
    "abtune.training": 5,
    "abtune.methods": 4,
    "abtune.dist": 3.5, "abtune.comm": 3,
    "abtune.models": 2, "abtune.data": 2,
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in ROOT.rglob("*.py")}


def imports(module: str, annotations: bool = False) -> set[str]:
    """The abtune modules `module` imports; with `annotations`, also those it imports only for annotations
    (under `if TYPE_CHECKING:`) and those a string annotation names (`"abtune.x.Y"`)."""
    found: set[str] = set()
    if annotations:
        found.update(_named_in_string_annotations(_tree(module)))
    for node, under_type_checking in _import_statements(module):
        if under_type_checking and not annotations:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            submodules = [f"{node.module}.{alias.name}" for alias in node.names]
            found.update([m for m in submodules if m in MODULES] or [node.module])
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m in MODULES and m != module}


@functools.cache
def _tree(module: str) -> ast.Module:
    return ast.parse(MODULES[module].read_text())


STATEMENT_LISTS = ("body", "orelse", "finalbody", "handlers", "cases")  # an import is a statement: in these only


@functools.cache
def _import_statements(module: str) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement of `module` (at its top, in functions, classes, branches), and whether it is under
    `if TYPE_CHECKING:` (either branch)."""
    found: list[tuple[ast.Import | ast.ImportFrom, bool]] = []

    def visit(node: ast.AST, under_type_checking: bool) -> None:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append((node, under_type_checking))
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            under_type_checking = True
        for field in STATEMENT_LISTS:
            for child in getattr(node, field, ()):
                visit(child, under_type_checking)

    visit(_tree(module), False)
    return found


def _named_in_string_annotations(tree: ast.AST) -> set[str]:
    """Modules named by dotted paths in string annotations: `"abtune.training.trainer.Trainer"`."""
    annotations = [annotation for n in ast.walk(tree) for annotation in _annotations_of(n)]
    texts = [c.value for a in annotations for c in ast.walk(a) if isinstance(c, ast.Constant) and isinstance(c.value, str)]
    return {prefix for text in texts for word in text.replace("[", " ").replace("]", " ").replace(",", " ").split()
            for prefix in _prefixes(word) if prefix in MODULES}


def _annotations_of(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.arg | ast.AnnAssign) and node.annotation:
        return [node.annotation]
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns:
        return [node.returns]
    return []


def _prefixes(dotted: str) -> list[str]:
    parts = dotted.split(".")
    return [".".join(parts[:n]) for n in range(2, len(parts) + 1)]


def torch_free_part_of_methods(module: str) -> bool:
    """The method registry (the package itself), each method's settings and the schedule's shape they
    share: leaves the configuration reads."""
    return module in ("abtune.methods", "abtune.methods.schedule") or (
        module.startswith("abtune.methods.") and module.endswith("settings"))


def layer(module: str) -> float:
    if torch_free_part_of_methods(module):
        return 1
    unit = ".".join(module.split(".")[:2])
    return LAYERS.get(unit, 1)


@functools.cache
def import_graph(annotations: bool = False) -> dict[str, set[str]]:
    """Each module's imports; with `annotations`, those made only for annotations too (a circle there is still
    two modules that know each other). Drawn when a test first asks, not while pytest collects this file."""
    return {module: imports(module, annotations) for module in MODULES}


def test_every_arrow_points_down_or_stays_in_its_layer() -> None:
    upward = sorted(f"{a} -> {b}" for a, targets in import_graph().items() for b in targets if layer(b) > layer(a))
    assert not upward, upward


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while (top := stack.pop()) != node:
                component.append(top)
            if component:
                found.append(sorted([node, *component]))

    for node in graph:
        if node not in index:
            visit(node)
    return found


@pytest.mark.parametrize("annotations", [False, True], ids=["imports", "with-annotation-imports"])
def test_no_modules_and_no_packages_import_each_other_in_a_circle(annotations: bool) -> None:
    graph = import_graph(annotations)
    assert not _circles(graph)
    packages: dict[str, set[str]] = defaultdict(set)
    for a, targets in graph.items():
        for b in targets:
            unit_a, unit_b = (".".join(m.split(".")[:2]) for m in (a, b))
            if unit_a != unit_b:
                packages[unit_a].add(unit_b)
    assert not _circles(packages)


def test_the_configuration_and_every_method_s_settings_load_without_torch() -> None:
    """The CLI, the study and promote read the run config and the method registry; torch stays unloaded."""
    assert {m for m in MODULES if torch_free_part_of_methods(m)} >= {"abtune.methods", "abtune.methods.ab.settings"}
    loaded = subprocess.run([sys.executable, "-c", "import sys, abtune.config, abtune.methods, abtune.cli; "
                             "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('abtune.methods')))"],
                            capture_output=True, text=True, check=True).stdout
    assert "'torch'" not in loaded and "'abtune.methods.ab.settings'" in loaded, loaded


def test_the_checker_sees_a_circle_and_an_upward_arrow() -> None:
    """A test that cannot fail is a defect: the same checks on a made-up graph."""
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert layer("abtune.training.worker") < layer("abtune.launch.local") < layer("abtune.study.runner")
    assert "abtune.training.hooks" in import_graph()["abtune.tracking.hook"]  # lazy and top-level imports are both seen
    assert "abtune.training.state" in import_graph(annotations=True)["abtune.training.summary"]  # under TYPE_CHECKING
    assert "abtune.training.state" not in import_graph()["abtune.training.summary"]
    assert _named_in_string_annotations(ast.parse('def f(t: "abtune.training.trainer.Trainer") -> "int": ...')) == {
        "abtune.training", "abtune.training.trainer"}


# The study's reports, one module per thing shown; each imports only those after it here.
REPORTS = ["status", "best", "trial_tables", "importances", "rerun", "export"]


def test_the_study_reports_import_down_their_list_and_only_the_command_line_reads_them() -> None:
    modules = [f"abtune.study.report.{name}" for name in REPORTS]
    assert {m for m in MODULES if m.startswith("abtune.study.report.")} == set(modules)  # every report is listed
    upward = [f"{a} -> {b}" for a in modules for b in import_graph()[a] if b in modules and modules.index(b) <= modules.index(a)]
    assert not upward, upward
    readers = {a for a, targets in import_graph().items() if targets & set(modules)} - set(modules)
    assert readers == {"abtune.study.cli"}, readers
