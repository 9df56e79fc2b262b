"""Whether a process still runs on this host: for runs, trials and fabrics whose owner may have died (psutil)."""

from __future__ import annotations

import os
from typing import Any

import psutil


def process_start(pid: int) -> str | None:
    """When the process started (psutil's create time), which tells a reused pid from the original."""
    try:
        return str(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def process_alive(record: dict[str, Any]) -> bool:
    """The process named by `pid` (and `start`, when known) runs on this host. A zombie has ended: an
    orphan whose new parent does not reap it would otherwise look alive for ever."""
    try:
        process = psutil.Process(int(record["pid"]))
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        return record.get("start") is None or _same_start(str(record["start"]), process)
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True  # it exists; another user's


def _same_start(recorded: str, process: psutil.Process) -> bool:
    """`recorded` is the process's start: psutil's create time, or (a record of an earlier version) the kernel's
    start in clock ticks since boot, as /proc/PID/stat gives it."""
    if recorded.isdigit():
        ticks = (process.create_time() - psutil.boot_time()) * os.sysconf("SC_CLK_TCK")
        return round(ticks) == int(recorded)
    return recorded == str(process.create_time())
