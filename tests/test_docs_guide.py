"""The docs read as a guide, not a changelog: no commit hashes, issue numbers or dates in the running text of
docs/ and README.md (BENCHMARKS.md keeps measurements with their commits and dates; pages link to it), no
paragraph too long to read, and every `abtune` command of a page's code blocks one that abtune accepts."""

from __future__ import annotations

import re
import shlex

import pytest

from abtune.cli import build_parser
from tests.conftest import REPO

GUIDE_PAGES = sorted([*(REPO / "docs").glob("*.md"), REPO / "README.md"])
MAX_PARAGRAPH_WORDS = 160

HISTORY = {
    "commit": re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b"),
    "issue": re.compile(r"(?<![\w&/])#\d+\b|\bissues? \d+\b|\bPR \d+\b", re.I),
    "date": re.compile(r"\b20\d\d-\d\d-\d\d\b"),
}
INLINE_CODE = re.compile(r"`[^`]*`")
LINK_TARGET = re.compile(r"\]\([^)]*\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def prose_blocks(text: str) -> list[tuple[int, str]]:
    """The page's paragraphs and list items outside code fences and tables, as (first line, text), with inline
    code and link targets removed: what a reader reads as prose."""
    blocks: list[tuple[int, str]] = []
    current: list[str] = []
    start, fenced = 0, False

    def close() -> None:
        if current:
            blocks.append((start, " ".join(current)))
            current.clear()

    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            close()
            fenced = not fenced
            continue
        if fenced:
            continue
        if line.startswith("#"):
            close()
            continue
        stripped = line.strip()
        starts_item = re.match(r"^([-*+]|\d+\.) ", stripped) is not None
        if not stripped or stripped.startswith(("|", "![", "<")) or starts_item:
            close()
            if not stripped or not starts_item:
                continue
        if not current:
            start = number
        current.append(LINK_TARGET.sub("]", INLINE_CODE.sub("", stripped)))
    close()
    return blocks


def history_in(text: str) -> list[str]:
    return [f"{line}: {kind} {match.group(0)!r}" for line, block in prose_blocks(text)
            for kind, pattern in HISTORY.items() for match in pattern.finditer(block)]


def long_paragraphs(text: str) -> list[str]:
    return [f"{line}: {len(block.split())} words" for line, block in prose_blocks(text)
            if len(block.split()) > MAX_PARAGRAPH_WORDS]


def test_no_page_carries_history_in_its_running_text() -> None:
    found = {str(p.relative_to(REPO)): hits for p in GUIDE_PAGES if (hits := history_in(p.read_text()))}
    assert found == {}


def test_no_page_has_a_paragraph_too_long_to_read() -> None:
    found = {str(p.relative_to(REPO)): hits for p in GUIDE_PAGES
             if (hits := long_paragraphs(p.read_text()))}
    assert found == {}


def test_the_history_check_sees_hashes_issues_and_dates_and_spares_code_and_links() -> None:
    text = ("Until a27c076 the study\nprinted nothing (issue 41, optuna #3450)\non 2026-11-26.\n\n"
            "Measured: [the run](../BENCHMARKS.md#quickstart-2026-11-26), `git checkout 5fda480`, ECR\n"
            "(equation 4) at 140.409 MB, seed 1234567, a deadbeef-free page.\n\n```\ncommit f5229c2\n```\n")
    assert history_in(text) == ["1: commit 'a27c076'", "1: issue 'issue 41'", "1: issue '#3450'",
                                "1: date '2026-11-26'"]


def test_a_paragraph_is_counted_until_a_blank_line_and_each_list_item_alone() -> None:
    words = " ".join(["word"] * (MAX_PARAGRAPH_WORDS + 1))
    assert long_paragraphs(f"{words}\n") == ["1: 161 words"]
    half = " ".join(["word"] * 100)
    assert long_paragraphs(f"{half}\n{half}\n\n- {half}\n- {half}\n") == ["1: 200 words"]


CONTINUED = re.compile(r"\\\n\s*")


def abtune_commands(text: str) -> list[str]:
    """Every `abtune ...` command a reader would copy: the lines of bash/sh/shell code blocks and the `$ `
    lines of the others (a line continued with a backslash joined), split at `&&` and `;`. A synopsis (a
    line with `[--option]` notation) and a line with `...` elided are not commands to copy."""
    commands = []
    for language, block in re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.M | re.S):
        for line in CONTINUED.sub(" ", block).splitlines():
            line = line.strip()
            if language not in ("bash", "sh", "shell") and not line.startswith("$ "):
                continue
            for part in re.split(r"\s*(?:&&|;)\s*", line.removeprefix("$ ")):
                if part.startswith("abtune ") and "..." not in part and "[" not in part:
                    commands.append(part)
    return commands


PAGE_COMMANDS = [(str(page.relative_to(REPO)), command) for page in GUIDE_PAGES
                 for command in abtune_commands(page.read_text())]


@pytest.mark.parametrize(("page", "command"), PAGE_COMMANDS, ids=[f"{p}: {c}"[:90] for p, c in PAGE_COMMANDS])
def test_every_abtune_command_of_the_docs_parses(page: str, command: str) -> None:
    words = shlex.split(command, comments=True)
    build_parser().parse_args(words[1:])
    for word in words:
        if re.fullmatch(r"(studies|launchers|clusters)/[\w.-]+\.yaml", word):
            assert (REPO / word).is_file(), f"{page}: {word}"
