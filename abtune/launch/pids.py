"""Whether a process still runs on this host: for runs, trials and fabrics whose owner may have died."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def process_start(pid: int) -> str | None:
    """The kernel's start time of a process (Linux), which tells a reused pid from the original."""
    stat = _stat(pid)
    return stat[19] if stat else None


def process_alive(record: dict[str, Any]) -> bool:
    """The process named by `pid` (and `start`, when known) runs on this host. A zombie has ended: an
    orphan whose new parent does not reap it would otherwise look alive for ever."""
    pid = int(record["pid"])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = _stat(pid)
    if stat is None:
        return True  # no /proc: the signal said it exists
    if stat[0] == "Z":
        return False
    return record.get("start") is None or stat[19] == record["start"]


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat from the field after the command name (state, ppid, ...)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
