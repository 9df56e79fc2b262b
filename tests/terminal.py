"""The installed `abtune` in a real pseudo-terminal of a given size, and what a reader sees there: its lines
(escape codes removed) and the tables among them with their headers put back together."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import re
import struct
import sys
import termios
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from rich.cells import cell_len

from tests.conftest import CLI_TIMEOUT_S, abtune_command, with_checkout_on_path

TERMINAL_SITE = Path(__file__).resolve().parent / "terminal_site"  # a sitecustomize.py for the commands started here
ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\x1b[()][A-Z0-9]")


def run_in_terminal(args: list[str], columns: int, cwd: Path, env: dict[str, str] | None = None,
                    rows: int = 50) -> tuple[int, list[str]]:
    """`abtune ARGS` on a `columns` x `rows` terminal (no $COLUMNS or $LINES to tell it otherwise): its exit
    code and the lines it showed, escape codes removed. It reads the importances the session computed
    (TERMINAL_SITE's sitecustomize.py), as a call in process does."""
    environment = {k: v for k, v in with_checkout_on_path(env or os.environ).items() if k not in ("COLUMNS", "LINES")}
    environment["PYTHONPATH"] = os.pathsep.join([str(TERMINAL_SITE), environment["PYTHONPATH"]])  # its importances
    environment["TERM"] = "xterm-256color"
    pid, fd = pty.fork()
    if pid == 0:  # the child: its stdin/stdout are the terminal
        try:
            fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
            os.chdir(cwd)
            command = [*abtune_command(), *args]
            os.execve(command[0], command, environment)
        finally:
            os._exit(127)
    output = bytearray()
    deadline = time.monotonic() + CLI_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        output += chunk
    os.close(fd)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), _lines(output)


def run_here_in_terminal(args: list[str], columns: int, cwd: Path, rows: int = 50) -> tuple[int, list[str]]:
    """What `run_in_terminal` shows, from `abtune.cli.main(ARGS)` in this process (torch and the study code
    imported once, not per command): its stdin, stdout and stderr (file descriptors 0-2, as rich measures
    them, and sys's streams) are a `columns` x `rows` pseudo-terminal for the call, without $COLUMNS, $LINES
    or a variable that forces colours. The installed command in a terminal of its own is `run_in_terminal`."""
    from abtune.cli import main

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    output = bytearray()
    reader = threading.Thread(target=_drain, args=(master, output), daemon=True)
    reader.start()
    try:
        with _std_streams_on(slave), pytest.MonkeyPatch.context() as patch:
            for name in ("COLUMNS", "LINES", "FORCE_COLOR", "TTY_COMPATIBLE", "NO_COLOR"):
                patch.delenv(name, raising=False)
            patch.setenv("TERM", "xterm-256color")
            patch.chdir(cwd)
            try:
                code = main(list(args))
            except SystemExit as exit_:  # argparse's usage errors
                code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
    finally:
        os.close(slave)  # the last descriptor of the terminal: the reader sees its end
        reader.join(timeout=CLI_TIMEOUT_S)
        os.close(master)
    return code, _lines(output)


@contextlib.contextmanager
def _std_streams_on(terminal: int) -> Iterator[None]:
    saved_fds = [os.dup(fd) for fd in (0, 1, 2)]
    saved_streams = (sys.stdin, sys.stdout, sys.stderr)
    try:
        for fd in (0, 1, 2):
            os.dup2(terminal, fd)
        sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False, buffering=1)  # noqa: SIM115
        sys.stderr = open(2, "w", encoding="utf-8", closefd=False, buffering=1)  # noqa: SIM115
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        sys.stdin, sys.stdout, sys.stderr = saved_streams
        for fd, saved in zip((0, 1, 2), saved_fds, strict=True):
            os.dup2(saved, fd)
            os.close(saved)


def _drain(master: int, output: bytearray) -> None:
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: every descriptor of the terminal is closed
            return
        if not chunk:
            return
        output += chunk


def _lines(output: bytes | bytearray) -> list[str]:
    text = ESCAPES.sub("", output.decode("utf-8", errors="replace")).replace("\r\n", "\n")
    return [line.split("\r")[-1] for line in text.split("\n")]  # a progress bar redraws its line


def too_wide(lines: list[str], columns: int) -> list[str]:
    return [line for line in lines if cell_len(line) > columns]


@dataclass
class ShownTable:
    title: str
    headers: list[str]  # each column's header, its wrapped lines joined again
    rows: list[list[str]]  # one entry per line of the body: a row that wrapped shows as two


def tables_in(lines: list[str]) -> list[ShownTable]:
    """Every rich table (heavy head box) in `lines`, a table continued below (its title ends in
    "(continued)", its first column repeated) merged into the one it continues. A title is the two lines
    above the table, as it may wrap."""
    found: list[ShownTable] = []
    for i, line in enumerate(lines):
        if not line.startswith("┏"):
            continue
        head_end = next(j for j in range(i, len(lines)) if lines[j].startswith("┡"))
        body_end = next(j for j in range(head_end, len(lines)) if lines[j].startswith("└"))
        pieces = [_cells(lines[j], "┃") for j in range(i + 1, head_end)]
        headers = [_joined([p[c] for p in pieces]) for c in range(len(pieces[0]))]
        rows = [_cells(lines[j], "│") for j in range(head_end + 1, body_end)]
        if lines[i - 1].strip().endswith("(continued)") and found:
            found[-1].headers += headers[1:]
            continue
        found.append(ShownTable(" ".join(line.strip() for line in lines[max(i - 2, 0):i]), headers, rows))
    return found


def _cells(line: str, bar: str) -> list[str]:
    return [cell.strip() for cell in line.strip()[1:-1].split(bar)]


def _joined(pieces: list[str]) -> str:
    text = ""
    for piece in filter(None, pieces):
        text += piece if not text or text.endswith((".", "_")) else f" {piece}"
    return text
