"""docs/layout.md's tree lists every module of abtune: read from the doc, checked against the files on disk.

The tree's entries start at the left margin (`abtune/study/  cli.py (...), ...`), continued on indented lines.
A module of the top level is named as `abtune/NAME.py` (or beside another, `abtune/models.py, data.py`); a
module of a package by its file name inside the package's entry, and one of a sub-package inside the
parentheses after `SUB/` (`report/ (status.py, ...)`). A package's `__init__.py` is its entry."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAYOUT = ROOT / "docs" / "layout.md"


def tree_entries(text: str) -> dict[str, str]:
    """The first code block's entries: first word -> the entry's whole text (its continuation lines joined)."""
    block = re.search(r"```\n(.*?)```", text, re.S).group(1)
    entries: dict[str, str] = {}
    current = None
    for line in block.splitlines():
        if line and not line[0].isspace():
            current = line.split()[0].rstrip(",")
            entries[current] = line
        elif current is not None:
            entries[current] += " " + line.strip()
    return entries


def _names(text: str, name: str) -> bool:
    return re.search(rf"(?<![\w/.]){re.escape(name)}(?![\w])", text) is not None


def _inside(text: str, opening: str) -> str:
    """The text inside the parentheses that follow `opening` (`report/ (` ... `)`), nesting respected."""
    start = text.find(opening)
    if start < 0:
        return ""
    depth, position = 0, start + len(opening) - 1
    for position in range(start + len(opening) - 1, len(text)):
        depth += {"(": 1, ")": -1}.get(text[position], 0)
        if depth == 0:
            break
    return text[start + len(opening):position]


def listed(module: Path, entries: dict[str, str]) -> bool:
    """Whether the tree names `module` (a path relative to the checkout, abtune/...)."""
    parts = module.parts
    if len(parts) == 2:
        top = " ".join(text for key, text in entries.items() if key.endswith(".py"))
        return _names(top, f"abtune/{parts[1]}") or _names(top, parts[1])
    entry = entries.get(f"abtune/{parts[1]}/", "")
    inner = parts[2:]
    if inner[-1] == "__init__.py":
        inner = inner[:-1]
        if not inner:
            return bool(entry)
        return f"{'/'.join(inner)}/" in entry
    for sub in inner[:-1]:
        entry = _inside(entry, f"{sub}/ (")
    return _names(entry, inner[-1])


def test_every_module_of_abtune_is_in_the_layout_tree() -> None:
    entries = tree_entries(LAYOUT.read_text())
    modules = sorted(p.relative_to(ROOT) for p in (ROOT / "abtune").rglob("*.py"))
    missing = [str(m) for m in modules if not listed(m, entries)]
    assert not missing, f"docs/layout.md's tree does not list: {', '.join(missing)}"


def test_the_reader_finds_modules_where_the_tree_puts_them_and_nowhere_else() -> None:
    entries = tree_entries("```\nabtune/cli.py   the command line\nabtune/models.py, data.py\n"
                           "abtune/study/    cli.py (x), report/ (status.py,\n                 best.py), warm.py\n```\n")
    assert listed(Path("abtune/cli.py"), entries) and listed(Path("abtune/data.py"), entries)
    assert listed(Path("abtune/study/warm.py"), entries) and listed(Path("abtune/study/report/best.py"), entries)
    assert listed(Path("abtune/study/report/__init__.py"), entries)
    assert not listed(Path("abtune/study/report/warm.py"), entries)  # warm.py is study's, not report's
    assert not listed(Path("abtune/study/runner.py"), entries) and not listed(Path("abtune/ui.py"), entries)
    assert not listed(Path("abtune/tracking/hook.py"), entries)
