"""A real headless browser for the dashboard tests: Debian's chromium, installed if missing (as root).

`Session.render(url, screenshot)` loads a page, lets its scripts run (the MLflow UI is a React app that
fetches its data after loading) and returns the DOM as it is then, saving a PNG of the window. One chromium
serves every page of a session, driven over its DevTools pipe: a chromium start-up and the MLflow UI's
scripts (from its cache) paid once, not once a page.
Where chromium cannot run (not installed, and not root to install it) the tests skip, except with
CI=true, where they fail (tests/system.py, as for SLURM and PostgreSQL).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import re
import select
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

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


def _above_4(fd: int) -> int:
    """`fd` moved to a number above 4."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 5)
    os.close(fd)
    return moved


class Session:
    """One headless chromium for many pages, over its DevTools pipe (it reads commands on fd 3, answers on
    fd 4, each a JSON message ended by a NUL byte). Each page gets a tab of its own, in the window's size, whose
    virtual time runs PAGE_TIME_MS as `chromium --virtual-time-budget` runs it; then its DOM and a screenshot."""

    def __init__(self, profile: Path) -> None:
        profile.mkdir(parents=True, exist_ok=True)
        self._log = profile / "chromium.log"  # a file, not a pipe: chromium never blocks on a full one
        commands, self._to_browser = os.pipe()
        self._from_browser, answers = os.pipe()
        commands, answers = (_above_4(fd) for fd in (commands, answers))  # not what the shell's 3 and 4 replace
        arguments = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--no-first-run", f"--user-data-dir={profile}", f"--window-size={WINDOW}", "--hide-scrollbars",
                     "--remote-debugging-pipe", "about:blank"]
        # bash (not dash: it takes fd numbers above 9) puts the pipes where chromium reads them: fd 3 and 4
        with self._log.open("wb") as log:
            self.process = subprocess.Popen(["bash", "-c", f'exec "$0" "$@" 3<&{commands} 4>&{answers} {commands}<&- {answers}>&-', *arguments],
                                            pass_fds=(commands, answers), stdout=subprocess.DEVNULL, stderr=log)
        os.close(commands)
        os.close(answers)
        self._buffer = b""
        self._next_id = 0
        self._events: list[dict[str, Any]] = []

    def render(self, url: str, screenshot: Path) -> str:
        """The DOM of `url` after PAGE_TIME_MS of page time; a screenshot of the same state at `screenshot`."""
        width, height = (int(n) for n in WINDOW.split(","))
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        tab = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        try:
            self.call("Emulation.setDeviceMetricsOverride", tab, width=width, height=height, deviceScaleFactor=1,
                      mobile=False)
            self.call("Emulation.setVirtualTimePolicy", tab, policy="pause")  # no page time before the page
            self.call("Page.navigate", tab, url=url)
            self.call("Emulation.setVirtualTimePolicy", tab, policy="pauseIfNetworkFetchesPending",
                      budget=PAGE_TIME_MS)
            self.wait_for("Emulation.virtualTimeBudgetExpired", tab)
            dom = self.call("Runtime.evaluate", tab, expression="document.documentElement.outerHTML",
                            returnByValue=True)["result"]["value"]
            self.call("Emulation.setVirtualTimePolicy", tab, policy="advance")  # a frame to capture
            screenshot.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", tab, format="png")["data"]))
        finally:
            self.call("Target.closeTarget", targetId=target)
        return dom

    def call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        """Send one command (to a tab's `session`, else to the browser) and return its result."""
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params, **({"sessionId": session} if session else {})}
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        while True:
            answer = self._receive()
            if answer.get("id") == self._next_id:
                assert "error" not in answer, (method, answer["error"])
                return answer.get("result", {})
            self._events.append(answer)

    def wait_for(self, event: str, session: str) -> dict[str, Any]:
        """The first `event` of the tab `session` (one already received, else the next)."""
        while True:
            found = next((e for e in self._events if e.get("method") == event and e.get("sessionId") == session), None)
            if found is not None:
                self._events.remove(found)
                return found
            self._events.append(self._receive())

    def _receive(self) -> dict[str, Any]:
        deadline = time.monotonic() + RENDER_TIMEOUT_S
        while b"\0" not in self._buffer:
            ready, _, _ = select.select([self._from_browser], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(self._from_browser, 1 << 20) if ready else b""
            if not chunk:
                raise AssertionError("chromium " + ("stopped answering" if ready else f"did not answer within "
                                     f"{RENDER_TIMEOUT_S} s") + f": {self._stderr_tail()}")
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(message)

    def _stderr_tail(self) -> str:
        return self._log.read_text(errors="replace")[-2000:]

    def close(self) -> None:
        with contextlib.suppress(OSError, AssertionError):
            self.call("Browser.close")
        os.close(self._to_browser)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        os.close(self._from_browser)


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
