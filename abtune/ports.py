"""A free TCP port on the loopback: for a run's rendezvous (MASTER_PORT) and for the servers abtune starts.
A leaf: the launchers and the tracking servers both read it."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port nothing on 127.0.0.1 listens on now (the kernel's choice; another process may take it next)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
