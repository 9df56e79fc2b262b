"""Running a process inside a named network namespace, as `ip netns exec NAME` does.

Two ways in: a new process behind the command prefix (`exec_prefix`), or a process that moves itself in
(`enter`: a warm rank, forked from a server that already imported torch). Both leave the process with
what `ip netns exec` gives it (iproute2's netns_switch): the namespace's network; a mount namespace of
its own whose mounts do not propagate back; a /sys that shows the namespace's interfaces; and each file
of /etc/netns/NAME bind-mounted over its namesake in /etc (an emulated node's hosts and resolv.conf).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

NETNS_DIR = Path("/run/netns")
ETC_NETNS = Path("/etc/netns")  # a namespace's own /etc files

# <sched.h> and <sys/mount.h>
CLONE_NEWNS = 0x00020000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_BIND = 4096
MS_REC = 16384
MS_SLAVE = 1 << 19
MNT_DETACH = 2


def exec_prefix(name: str) -> list[str]:
    """The command prefix that starts a process inside namespace `name`."""
    return ["ip", "netns", "exec", name]


def can_enter(name: str) -> str | None:
    """Why this process could not `enter` namespace `name` (None: it can)."""
    if os.geteuid() != 0:
        return "entering a network namespace needs root"
    if not (NETNS_DIR / name).exists():
        return f"no network namespace {name}"
    return None


def enter(name: str) -> None:
    """Move this single-threaded process into namespace `name` for good; OSError if a step fails."""
    libc = ctypes.CDLL(None, use_errno=True)
    with open(NETNS_DIR / name) as namespace:
        _check(libc.setns(namespace.fileno(), CLONE_NEWNET), f"setns {name}")
    _check(libc.unshare(CLONE_NEWNS), "unshare the mount namespace")
    _check(libc.mount(b"", b"/", b"none", MS_SLAVE | MS_REC, None), "make / a slave mount")
    read_only = 0
    if libc.umount2(b"/sys", MNT_DETACH) != 0 and os.statvfs("/sys").f_flag & os.ST_RDONLY:
        read_only = MS_RDONLY  # as ip does: a read-only /sys it cannot unmount stays read-only
    _check(libc.mount(name.encode(), b"/sys", b"sysfs", read_only, None), "mount /sys")
    own = ETC_NETNS / name
    for entry in sorted(own.iterdir()) if own.is_dir() else []:
        target = Path("/etc", entry.name)
        if target.exists():  # ip skips what /etc lacks too
            _check(libc.mount(bytes(entry), bytes(target), b"none", MS_BIND, None), f"bind {entry} to {target}")


def _check(result: int, step: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{step}: {os.strerror(errno)}")
