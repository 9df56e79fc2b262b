"""A real headless browser for the dashboard tests: Debian's chromium, installed if missing (as root).

`render(url, screenshot)` loads a page, lets its scripts run (the MLflow UI is a React app that
fetches its data after loading) and returns the DOM as it is then, saving a PNG of the window.
Where chromium cannot run (not installed, and not root to install it) the tests skip, except with
CI=true, where they fail (tests/system.py, as for SLURM and PostgreSQL).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

from tests import system

PACKAGE = "chromium"
RENDER_TIMEOUT_S = 180
# Virtual time: chromium runs the page's timers and waits for its requests until this much page time
# has passed, independent of how busy the machine is, then dumps the DOM.
PAGE_TIME_MS = 30_000
WINDOW = "1600,1000"


def chromium() -> str:
    """The chromium executable; apt-get installs it first when missing and we are root (tests/system.py)."""
    not_installed = None if shutil.which(PACKAGE) else system.apt_get_install([PACKAGE])
    found = shutil.which(PACKAGE)
    if found is None:
        system.unavailable("headless chromium", not_installed or f"{PACKAGE} is installed but not on PATH")
    return found


def render(url: str, screenshot: Path, profile: Path) -> str:
    """The DOM of `url` after PAGE_TIME_MS of page time; a screenshot of the same state at `screenshot`."""
    common = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--no-first-run", f"--user-data-dir={profile}", f"--window-size={WINDOW}",
              f"--virtual-time-budget={PAGE_TIME_MS}", "--hide-scrollbars"]
    result = subprocess.run([*common, f"--screenshot={screenshot}", "--dump-dom", url], capture_output=True,
                            text=True, timeout=RENDER_TIMEOUT_S)
    assert result.returncode == 0 and screenshot.is_file(), result.stderr[-2000:]
    return result.stdout


VOID_ELEMENTS = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


@dataclass
class Row:
    """One row of an ag-grid table (the MLflow runs table) as rendered: its place and its cells' text."""

    position: int  # aria-rowindex: the order on screen
    cells: dict[str, str] = field(default_factory=dict)  # col-id -> text
    columns: dict[str, int] = field(default_factory=dict)  # col-id -> aria-colindex (the order on screen)


class _GridParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, Row] = {}
        self._stack: list[tuple[str, str | None, str | None]] = []  # (tag, row id, col id) opened here

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in VOID_ELEMENTS:
            return
        found = dict(attrs)
        row = found.get("row-id") if found.get("role") == "row" else None
        col = found.get("col-id") if found.get("role") == "gridcell" else None
        if row is not None:
            self.rows.setdefault(row, Row(int(found.get("aria-rowindex") or 0)))
        if col is not None and self._row() is not None:
            self.rows[self._row()].columns[col] = int(found.get("aria-colindex") or 0)
        self._stack.append((tag, row, col))

    def handle_endtag(self, tag: str) -> None:
        while self._stack:
            if self._stack.pop()[0] == tag:
                break

    def handle_data(self, data: str) -> None:
        row, col = self._row(), self._col()
        if row is not None and col is not None and data.strip():
            cells = self.rows[row].cells
            cells[col] = (cells.get(col, "") + " " + data.strip()).strip()

    def _row(self) -> str | None:
        return next((r for _, r, _ in reversed(self._stack) if r is not None), None)

    def _col(self) -> str | None:
        return next((c for _, _, c in reversed(self._stack) if c is not None), None)


def chart_sections(dom: str) -> list[tuple[str, int]]:
    """The sections of an MLflow run page's metrics tab, in order: (name, number of charts)."""
    return [(name, int(count)) for name, count in re.findall(r">([^<>]{1,80})</div><div[^>]*>\((\d+)\)</div>", dom)]


def grid_rows(dom: str) -> dict[str, Row]:
    """Row id (for the MLflow runs table: the run id) -> the row, merged over ag-grid's column containers."""
    parser = _GridParser()
    parser.feed(dom)
    return parser.rows


UI_READY_TIMEOUT_S = 240


def start_ui(cwd: Path, env: dict[str, str]) -> tuple[subprocess.Popen[str], list[str]]:
    """`abtune ui` without options, in a session of its own; returns it once it is up, with the lines it printed
    (the services' addresses, the experiments' links)."""
    from tests.conftest import abtune_command

    process = subprocess.Popen([*abtune_command(), "ui"], cwd=cwd, env={**env, "PYTHONUNBUFFERED": "1"},
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    deadline = time.monotonic() + UI_READY_TIMEOUT_S
    while time.monotonic() < deadline and process.stdout is not None:
        line = process.stdout.readline()
        if not line and process.poll() is not None:
            break
        lines.append(line.rstrip())
        if line.startswith("Ctrl-C"):
            return process, lines
    process.kill()
    raise AssertionError(f"abtune ui did not come up: {lines}")
