"""A hung rank 0 serves the rendezvous store: it ends once its peers have stopped using it, not after a fixed
wait (abtune/training/hang.py: until_peers_leave). A peer still publishing or reading when the store dies makes
c10d print a stack above the launcher's one-line error."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import torch.distributed as dist

from abtune.dist import StoreBoard
from abtune.launch.local import free_port
from abtune.training import hang
from abtune.training.hang import Heard, until_peers_leave

PUBLISH_EVERY_S = 0.05


@pytest.fixture
def board(monkeypatch: pytest.MonkeyPatch) -> Iterator[StoreBoard]:
    """Rank 0's store, served here, and a client of it as a rank has; silence and polls shortened."""
    monkeypatch.setattr(hang, "SILENT_S", 0.5)
    monkeypatch.setattr(hang, "CHECK_SECONDS", 0.1)
    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    yield StoreBoard(3, timeout_s=600)
    del server


class Peer:
    """A rank that publishes its progress until it leaves (ends, or freezes)."""

    def __init__(self, board: StoreBoard, rank: int, publications: int | None) -> None:
        self.left = threading.Event()
        self.last_published = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._publish, args=(board, rank, publications), daemon=True)
        self._thread.start()

    def _publish(self, board: StoreBoard, rank: int, publications: int | None) -> None:
        count = 0
        while not self._stop.is_set() and (publications is None or count < publications):
            self.last_published = time.time()
            board.publish(rank, Heard(rank, 0, "", self.last_published, 1.0, "in step 3", None).to_json())
            count += 1
            time.sleep(PUBLISH_EVERY_S)
        self.left.set()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def test_rank_0_ends_only_after_every_peer_has_stopped_publishing(board: StoreBoard) -> None:
    board.publish(0, Heard(0, 0, "", time.time(), 9.0, "in step 3", "all_reduce", True).to_json())  # itself
    early, late = Peer(board, 1, publications=5), Peer(board, 2, publications=30)
    until_peers_leave(board, me=0, limit_s=60)
    assert early.left.is_set() and late.left.is_set(), "a peer was still publishing"
    assert time.time() - late.last_published > hang.SILENT_S


def test_a_peer_that_never_leaves_holds_rank_0_only_until_the_limit(board: StoreBoard) -> None:
    staying = Peer(board, 1, publications=None)
    try:
        until_peers_leave(board, me=0, limit_s=0.5)
        assert not staying.left.is_set()
    finally:
        staying.stop()


def test_a_frozen_peer_does_not_hold_rank_0(board: StoreBoard) -> None:
    """A peer stopped (SIGSTOP, a dead node) published last long ago: rank 0 ends at once, not at the limit."""
    board.publish(2, Heard(2, 1, "", time.time() - 10, 1.0, "in step 3", None).to_json())
    done = threading.Event()
    waiter = threading.Thread(target=lambda: (until_peers_leave(board, me=0, limit_s=600), done.set()), daemon=True)
    waiter.start()
    waiter.join(timeout=60)
    assert done.is_set(), "rank 0 waited for a peer that is frozen"
