"""Rendering accidents that `mkdocs build --strict` lets pass, beyond the stray `#` line at the start of a
paragraph (tests/test_docs_headings.py): an indented block that starts with a `#` word (a list item's
continuation paragraph renders it as a heading inside the item; a wrapped line of a paragraph does not), a wrapped line of only `-` or `=` under text (a
setext heading: the paragraph above becomes a title), a code fence indented into a list item (the site's
plain fenced_code extension fences only at the top level, so the block renders as one line of inline code,
its language word included), and a code fence left open (the rest of the page becomes code)."""

from __future__ import annotations

import re

from tests.conftest import REPO

PAGES = sorted([*(REPO / "docs").glob("**/*.md"), REPO / "README.md", REPO / "BENCHMARKS.md"])
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^#{1,6} \S")
SETEXT_UNDERLINE = re.compile(r"^\s{0,3}(=+|-+)\s*$")


def accidents(text: str) -> list[str]:
    found, fenced, previous = [], False, ""
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            if line != line.lstrip():
                found.append(f"{number}: an indented code fence renders as inline code")
            fenced = not fenced
            previous = ""
            continue
        if fenced:
            continue
        stripped = line.strip()
        starts_block = not previous.strip()
        if starts_block and line != line.lstrip() and stripped.startswith("#") and not HEADING.match(stripped):
            found.append(f"{number}: an indented block starts with '#': {stripped[:40]}")
        is_prose = previous.strip() and not previous.lstrip().startswith(("|", "#", "<", "!["))
        if SETEXT_UNDERLINE.match(line) and is_prose:
            found.append(f"{number}: a line of '{stripped[0]}' under text makes it a heading")
        previous = line
    if fenced:
        found.append("a code fence is never closed")
    return found


def test_no_page_has_a_rendering_accident() -> None:
    found = {str(page.relative_to(REPO)): hits for page in PAGES if (hits := accidents(page.read_text()))}
    assert found == {}


def test_the_check_sees_each_accident_and_spares_code_tables_and_headings() -> None:
    text = ("- an item that wraps as optuna\n  #3449) says\n\n    #3450) more\n\nA paragraph whose wrapped line is a dash\n-\n\n"
            "| a | b |\n|---|---|\n\n## A heading\n\n```bash\n  # a comment\n-\n```\n\n1. a step\n\n    ```bash\n    abtune\n    ```\n\n```text\nopen\n")
    assert accidents(text) == ["4: an indented block starts with '#': #3450) more",
                               "7: a line of '-' under text makes it a heading",
                               "21: an indented code fence renders as inline code",
                               "23: an indented code fence renders as inline code",
                               "a code fence is never closed"]
