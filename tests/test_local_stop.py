"""How the local launcher stops its ranks once one has failed (abtune/launch/local.py:_stop)."""

from __future__ import annotations

import signal
import subprocess
import sys

from abtune.launch import local


class Recorded(subprocess.Popen):
    """A real process whose SIGTERM is noted with the exit codes its peers had at that moment."""

    def __init__(self, name: str, log: list, peers: list) -> None:
        super().__init__([sys.executable, "-c", "import time; time.sleep(600)"])
        self.name, self.log, self.peers = name, log, peers

    def terminate(self) -> None:
        self.log.append((self.name, [peer.poll() for peer in self.peers if peer is not self]))
        super().terminate()


def test_rank_0_the_store_host_is_stopped_after_every_peer_has_exited() -> None:
    log: list = []
    ranks: list = []
    ranks.extend(Recorded(f"rank {rank}", log, ranks) for rank in range(3))
    local._stop(ranks)
    assert [name for name, _ in log] == ["rank 1", "rank 2", "rank 0"]
    assert log[-1][1] == [-signal.SIGTERM, -signal.SIGTERM], "both peers had exited before rank 0 was told to"

