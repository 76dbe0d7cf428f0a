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

A publisher is told what it waits for (a NOTICE, sent by the loop: ``due_notices``)
once none of its confirmations held for one reason (the standbys, or one queue) was
sent for ``NOTICE_AFTER_MS``, and again every ``NOTICE_EVERY_MS`` while that lasts.
For that each publisher keeps, per reason, a count and the time of its last progress
(the first hold, or the last release): a few entries per publisher, looked at only when
the earliest of them may be due, never a scan of what is held.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import time
from collections.abc import Callable

from zq.core.errors import LimitError

CONFIRMATIONS_HELD_PER_PEER_MAX = 4096  # publish frames of one connection waiting for a held CONFIRM

NOTICE_AFTER_MS = 1000  # a publisher is told what it waits for once nothing was confirmed for this long ...
NOTICE_EVERY_MS = 5000  # ... and again this often while the wait lasts (per reason)
REPLICAS: str | None = None  # the reason of replicas_ack waits (flow-control ones are their queue's name)
NEVER = 1 << 62

Send = Callable[[bytes, bytes], object]


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


class Wait:
    """One publisher's confirmations held for one reason."""

    __slots__ = ("count", "since", "told")

    def __init__(self, since: int) -> None:
        self.count = 1
        self.since = since  # ms: the first hold, or the last release since (the last progress)
        self.told = 0  # ms: the last NOTICE about it (0: none yet)

    def due(self) -> int:
        """When a NOTICE about it is due."""
        due = self.since + NOTICE_AFTER_MS
        return max(due, self.told + NOTICE_EVERY_MS) if self.told else due


class HeldConfirmations:
    def __init__(self, clock: Callable[[], int] = wall_ms) -> None:
        self.replicated: list[tuple[int, int, bytes, bytes]] = []  # heap: (needs, order, peer, frame)
        self.flow: dict[str, list[tuple[bytes, bytes, list[str]]]] = {}  # a blocked queue -> what waits on it
        self.per_peer: collections.Counter[bytes] = collections.Counter()
        self.flow_count = 0
        self._order = itertools.count()
        self.clock = clock
        # What each publisher with something held waits for: reason (REPLICAS, or a
        # queue's name) -> its Wait. Empty when nothing is held.
        self.waits: dict[bytes, dict[str | None, Wait]] = {}
        self.next_notice_ms = NEVER  # no NOTICE is due before this (a lower bound)

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
        self._waits_on(peer_id, REPLICAS, self.clock())

    def release_replicated(self, upto: int, send: Send) -> None:
        """Send those whose last bookmark is below ``upto`` (synced on enough standbys)."""
        # (self.replicated is read again each time: a send that finds its peer gone drops
        # the peer, and drop_peer replaces the heap)
        if not self.replicated or self.replicated[0][0] > upto:
            return
        now = self.clock()
        while self.replicated and self.replicated[0][0] <= upto:
            _, _, peer_id, frame = heapq.heappop(self.replicated)
            self._forget(peer_id)
            self._waited(peer_id, REPLICAS, now)
            send(peer_id, frame)

    # --------------------------------------------------- flow control

    def hold_flow(self, peer_id: bytes, frame: bytes, blocked: list[str]) -> None:
        self.flow.setdefault(blocked[0], []).append((peer_id, frame, blocked))
        self.per_peer[peer_id] += 1
        self.flow_count += 1
        self._waits_on(peer_id, blocked[0], self.clock())

    def release_flow(self, still_blocked: Callable[[str], bool], confirm: Send) -> None:
        """Confirm what waited on queues no longer over their limits; what still waits on
        another of its queues is filed under that one."""
        if not self.flow:
            return
        drained = [name for name in self.flow if not still_blocked(name)]
        if not drained:
            return
        now = self.clock()
        for name in drained:
            for peer_id, frame, names in self.flow.pop(name, ()):  # (a send may have dropped a peer's)
                if peer_id not in self.waits:  # dropped by a send of this release (drop_peer missed
                    self.flow_count -= 1  # these: they were popped with the list)
                    continue
                self._waited(peer_id, name, now)
                other = next((n for n in names if n != name and still_blocked(n)), None)
                if other is not None:
                    self.flow.setdefault(other, []).append((peer_id, frame, names))
                    self._waits_on(peer_id, other, now)
                    continue
                self.flow_count -= 1
                self._forget(peer_id)
                confirm(peer_id, frame)

    # --------------------------------------------------- publishers

    def drop_peer(self, peer_id: bytes) -> None:
        """A publisher left: what it was owed goes with it (and nothing more is said to it)."""
        self.waits.pop(peer_id, None)
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

    # --------------------------------------------------- notices

    def _waits_on(self, peer_id: bytes, reason: str | None, now: int) -> None:
        waits = self.waits.get(peer_id)
        if waits is None:
            waits = self.waits[peer_id] = {}
        wait = waits.get(reason)
        if wait is None:
            waits[reason] = Wait(now)
            if now + NOTICE_AFTER_MS < self.next_notice_ms:
                self.next_notice_ms = now + NOTICE_AFTER_MS
        else:
            wait.count += 1

    def _waited(self, peer_id: bytes, reason: str | None, now: int) -> None:
        """One of ``peer_id``'s confirmations held for ``reason`` is no longer: progress."""
        waits = self.waits.get(peer_id)
        wait = waits.get(reason) if waits is not None else None
        if wait is None:
            return
        wait.count -= 1
        if wait.count > 0:
            wait.since = now
            return
        del waits[reason]  # type: ignore[union-attr]
        if not waits:
            del self.waits[peer_id]

    def due_notices(self, now: int) -> list[tuple[bytes, str | None, Wait]]:
        """The waits a publisher is to be told about now: (peer, reason, its Wait), each
        marked as told. Looks at the waits only once the earliest may be due."""
        if now < self.next_notice_ms:
            return []
        due: list[tuple[bytes, str | None, Wait]] = []
        earliest = NEVER
        for peer_id, waits in self.waits.items():
            for reason, wait in waits.items():
                at = wait.due()
                if at <= now:
                    wait.told = now
                    due.append((peer_id, reason, wait))
                    at = now + NOTICE_EVERY_MS
                earliest = min(earliest, at)
        self.next_notice_ms = earliest
        return due
