"""One training of a run folder at a time: `abtune train --resume` refuses while the old ranks run.

The launcher and rank 0 each hold a shared flock on RUN_DIR/run.lock: rank 0 for as long as it lives,
the launcher until its launch ends (`release_run`; a command ends with it).
Claiming a run takes the lock exclusively first, which fails while any holder lives: a launcher
killed with SIGKILL leaves its ranks running, and rank 0 still holds the run. The kernel drops the
lock of a process that ends in any way, so a dead process never blocks; the file's lines (who, pid,
host) only name the holders in the refusal, and a launcher that lets the run go takes its line out.
On a shared file system the lock spans hosts where the file system supports flock (NFSv4 does).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import sys
from pathlib import Path
from typing import IO

from abtune.errors import ConfigError

LOCK_FILE = "run.lock"
_held: dict[Path, IO[str]] = {}  # lock file -> its handle, open until release_run: closing it drops the lock


def claim_run(run_dir: Path) -> None:
    """The launcher: refuse if an earlier launcher or rank 0 of this run is alive, else hold the run."""
    handle = (run_dir / LOCK_FILE).open("a+")
    if not _lock(handle, fcntl.LOCK_EX):
        raise ConfigError(_busy(run_dir))
    handle.truncate(0)  # every earlier holder is gone
    _record(handle, "launcher")
    if not _lock(handle, fcntl.LOCK_SH):  # let rank 0 join
        raise ConfigError(_busy(run_dir))
    _held[(run_dir / LOCK_FILE).resolve()] = handle


def release_run(run_dir: Path) -> None:
    """The launcher, once its launch has ended: let the run go (the end of the process does too), so that a
    process that launches again, `abtune.cli.main` called twice in one Python, may resume it."""
    handle = _held.pop((run_dir / LOCK_FILE).resolve(), None)
    if handle is None:
        return
    # Drop this launcher's line, so that a refusal while rank 0 still trains names rank 0 only, not a
    # launcher that is done (and alive, in a notebook). A line rank 0 appends meanwhile may be lost: the
    # refusal then says "another process", and the lock itself is unaffected.
    try:
        with contextlib.suppress(OSError, ValueError):  # the lines only name holders: never fail a launch's end
            mine = _line("launcher")
            handle.seek(0)  # the handle, not its name: the name may be relative to a folder since left
            kept = [line for line in handle.read().splitlines(keepends=True) if line != mine]
            handle.truncate(0)
            handle.writelines(kept)  # "a+": written at the end, which is now the start
            handle.flush()
    finally:
        with contextlib.suppress(OSError):
            handle.close()  # and with it the lock


def check_idle(run_dir: Path) -> None:
    """Refuse, without claiming it, a run whose earlier launch still trains."""
    if not (run_dir / LOCK_FILE).exists():
        return
    handle = (run_dir / LOCK_FILE).open("a+")
    if not _lock(handle, fcntl.LOCK_EX):
        raise ConfigError(_busy(run_dir))
    handle.close()  # and with it the lock


def join_run(run_dir: Path) -> IO[str]:
    """Rank 0: hold the run next to its launcher, so a resume is refused even if the launcher dies.

    Returns the open lock file: closing it (or the end of the process) lets the run go."""
    handle = (run_dir / LOCK_FILE).open("a+")
    if not _lock(handle, fcntl.LOCK_SH):  # a new launcher claimed the run: this launch is over
        raise ConfigError(f"{run_dir}: another launch of this run has taken it over; this one stops")
    _record(handle, "rank 0")
    return handle


def _lock(handle: IO[str], mode: int) -> bool:
    try:
        fcntl.flock(handle, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return False
    except OSError as error:  # a file system without flock: train, but say what is not guarded
        if error.errno not in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP):
            raise
        print(f"abtune: warning: {handle.name}: cannot lock ({error.strerror}); a --resume of this run "
              "would not be refused while it trains", file=sys.stderr)
    return True


def _record(handle: IO[str], who: str) -> None:
    handle.write(_line(who))
    handle.flush()


def _line(who: str) -> str:
    return f"{who} pid {os.getpid()} on {socket.gethostname()}\n"


def _busy(run_dir: Path) -> str:
    lines = (run_dir / LOCK_FILE).read_text().splitlines()
    who = "; ".join(line for line in lines if _may_live(line)) or "another process"
    return (f"{run_dir} is still training ({who}); wait for it to end or stop it first, "
            "then resume: two trainings would write one run folder")


def _may_live(line: str) -> bool:
    """A holder on this host is listed only while its process exists (a killed launcher is not)."""
    _, _, rest = line.partition(" pid ")
    pid, _, host = rest.partition(" on ")
    if host != socket.gethostname() or not pid.isdigit():
        return bool(line.strip())
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
