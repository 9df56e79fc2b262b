"""Every line of a docs page that starts with `#` is a heading its author meant: the site (Python-Markdown)
makes any such line a heading, `#3450), ...` wrapped to the start of a line included, and `--strict` lets it
pass; a fenced code block's comments are not headings."""

from __future__ import annotations

import re

from tests.conftest import REPO

PAGES = sorted([*(REPO / "docs").glob("**/*.md"), REPO / "README.md", REPO / "BENCHMARKS.md"])
HEADING = re.compile(r"^#{1,6} \S")  # hashes, one space, a title


def stray_headings(text: str) -> list[str]:
    """Lines outside code fences that start with `#` without being `#{1,6} Title`."""
    stray, fenced = [], False
    for number, line in enumerate(text.splitlines(), start=1):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and line.startswith("#") and not HEADING.match(line):
            stray.append(f"{number}: {line}")
    return stray


def test_no_page_has_a_stray_heading() -> None:
    found = {str(page.relative_to(REPO)): lines for page in PAGES if (lines := stray_headings(page.read_text()))}
    assert found == {}


def test_the_check_sees_a_wrapped_issue_number_and_spares_code() -> None:
    text = "Optuna refuses them (optuna\n#3450), and so on.\n\n```bash\n#!/bin/bash\n# a comment\n```\n## A heading\n"
    assert stray_headings(text) == ["2: #3450), and so on."]
