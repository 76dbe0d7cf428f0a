"""Publish confirmations the dispatcher holds back, and for whom.

A CONFIRM waits when its messages went into a queue over its limits (flow control:
until the queue drains) or, with ``replicas_ack``, until enough standbys have synced
past its last bookmark. Either wait can be long (no standby at all, a queue nobody
drains), so what is held must cost the loop only what it releases, never a scan of
everything held, and must not outlive, or grow without bound for, its publisher:

* replicated ones sit in a heap by the bookmark they need: a release pops only what the
  standbys passed;
* flow-held ones are filed under one queue still over its limits: a release looks only
  at the queues that drained;
* a publisher that leaves takes its held confirmations with it (nobody could read them);
* one publisher holds at most ``CONFIRMATIONS_HELD_PER_PEER_MAX``: its next publish is
  refused (``limit``, nothing stored) until some are released. A client's own window
  (1,024 frames) stays well inside it.
"""

from __future__ import annotations

import collections
import heapq
import itertools
from collections.abc import Callable

from zq.core.errors import LimitError

CONFIRMATIONS_HELD_PER_PEER_MAX = 4096  # publish frames of one connection waiting for a held CONFIRM

Send = Callable[[bytes, bytes], object]


class HeldConfirmations:
    def __init__(self) -> None:
        self.replicated: list[tuple[int, int, bytes, bytes]] = []  # heap: (needs, order, peer, frame)
        self.flow: dict[str, list[tuple[bytes, bytes, list[str]]]] = {}  # a blocked queue -> what waits on it
        self.per_peer: collections.Counter[bytes] = collections.Counter()
        self.flow_count = 0
        self._order = itertools.count()

    def __len__(self) -> int:
        return sum(self.per_peer.values())

    def check_room(self, peer_id: bytes) -> None:
        """Before a publish is applied: may this peer have one more held?"""
        if self.per_peer.get(peer_id, 0) >= CONFIRMATIONS_HELD_PER_PEER_MAX:
            raise LimitError(f"{CONFIRMATIONS_HELD_PER_PEER_MAX} of this connection's publishes are waiting for "
                             "their confirmation (standbys behind, or queues over their limits): nothing stored; "
                             "publish again once some are confirmed")

    # --------------------------------------------------- replicas_ack

    def hold_replicated(self, peer_id: bytes, frame: bytes, needs: int) -> None:
        heapq.heappush(self.replicated, (needs, next(self._order), peer_id, frame))
        self.per_peer[peer_id] += 1

    def release_replicated(self, upto: int, send: Send) -> None:
        """Send those whose last bookmark is below ``upto`` (synced on enough standbys)."""
        # (self.replicated is read again each time: a send that finds its peer gone drops
        # the peer, and drop_peer replaces the heap)
        while self.replicated and self.replicated[0][0] <= upto:
            _, _, peer_id, frame = heapq.heappop(self.replicated)
            self._forget(peer_id)
            send(peer_id, frame)

    # --------------------------------------------------- flow control

    def hold_flow(self, peer_id: bytes, frame: bytes, blocked: list[str]) -> None:
        self.flow.setdefault(blocked[0], []).append((peer_id, frame, blocked))
        self.per_peer[peer_id] += 1
        self.flow_count += 1

    def release_flow(self, still_blocked: Callable[[str], bool], confirm: Send) -> None:
        """Confirm what waited on queues no longer over their limits; what still waits on
        another of its queues is filed under that one."""
        if not self.flow:
            return
        drained = [name for name in self.flow if not still_blocked(name)]
        for name in drained:
            for peer_id, frame, names in self.flow.pop(name, ()):  # (a send may have dropped a peer's)
                other = next((n for n in names if n != name and still_blocked(n)), None)
                if other is not None:
                    self.flow.setdefault(other, []).append((peer_id, frame, names))
                    continue
                self.flow_count -= 1
                self._forget(peer_id)
                confirm(peer_id, frame)

    # --------------------------------------------------- publishers

    def drop_peer(self, peer_id: bytes) -> None:
        """A publisher left: what it was owed goes with it."""
        if not self.per_peer.pop(peer_id, 0):
            return
        kept = [item for item in self.replicated if item[2] != peer_id]
        if len(kept) != len(self.replicated):
            heapq.heapify(kept)
            self.replicated = kept
        for name in list(self.flow):
            waiting = [item for item in self.flow[name] if item[0] != peer_id]
            self.flow_count -= len(self.flow[name]) - len(waiting)
            if waiting:
                self.flow[name] = waiting
            else:
                del self.flow[name]

    def _forget(self, peer_id: bytes) -> None:
        left = self.per_peer.get(peer_id, 0) - 1
        if left > 0:
            self.per_peer[peer_id] = left
        else:
            self.per_peer.pop(peer_id, None)
