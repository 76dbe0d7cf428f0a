"""Leases: a delivery is a lease on a message, until it is settled or runs out.

Leases are kept per delivered batch (one ``Lease`` per subscription per engine step),
not per message; ``Queue.lease_of`` maps a leased sequence number to its lease, and
``Queue.meta`` keeps the message's delivery count (the fence's epoch: a settle names
the count it was delivered with). Lease deadlines of one queue grow monotonically
(constant lease period, monotonic time), so expiry walks a deque from the front;
extended leases, whose deadlines are arbitrary, go to a small heap: both are
``LeaseClock``'s. A claim may bring its own period (never past ``max_lease_age``).
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import TYPE_CHECKING, Final

from zq.core import grouping

if TYPE_CHECKING:
    from zq.core.grouping import Group
    from zq.core.queue import Queue, Subscription

# ``Queue.meta``: the counters of a message delivered at least once, packed in one int:
# deliveries in bits 0-15 (the delivery count is the fence's epoch), cancels in bits
# 16-31, the group id from bit 32. Every part that reads them imports these.
D_MASK: Final = 0xFFFF
C_SHIFT: Final = 16
C_ONE: Final = 1 << C_SHIFT
G_SHIFT: Final = 32


class Lease:
    __slots__ = ("sub", "deadline_ms", "seqs", "live", "started_ms")

    def __init__(self, sub: Subscription, deadline_ms: int, started_ms: int = 0) -> None:
        self.sub = sub
        self.deadline_ms = deadline_ms
        self.started_ms = started_ms
        self.seqs: list[int] = []
        self.live = 0  # how many of ``seqs`` this lease still holds


class LeaseClock:
    """When each lease runs out (the theory of operation: "A delivery is a lease").

    Leases of the queue's own period are made in deadline order (one period, monotonic
    time), so they wait in ``in_order`` and run out from its front; a lease with any
    other deadline (a claim's own period, an extension, a renewal) waits in ``heap``. A
    lease that has settled (``live`` 0) is dropped wherever it is met, never waited for."""

    __slots__ = ("in_order", "heap", "tiebreak")

    def __init__(self) -> None:
        self.in_order: deque[Lease] = deque()
        self.heap: list[tuple[int, int, Lease]] = []
        self.tiebreak = 0  # heap entries of equal deadlines keep the order they came in

    def add_in_order(self, lease: Lease) -> None:
        """A lease of the queue's period: it ends after every lease added before it."""
        self.in_order.append(lease)

    def add(self, lease: Lease) -> None:
        """A lease with a deadline of its own."""
        self.tiebreak += 1
        heapq.heappush(self.heap, (lease.deadline_ms, self.tiebreak, lease))

    def period_changed(self) -> None:
        """The queue's lease period changed: new leases could end before the old ones, so
        the old ones that still hold something wait by deadline instead."""
        for lease in self.in_order:
            if lease.live:
                self.add(lease)
        self.in_order.clear()

    def pop_due(self, now_ms: int) -> Lease | None:
        """The next lease that ran out by ``now_ms`` or has settled, taken off the clock
        (those in order first, as they always were); None when there is none."""
        in_order = self.in_order
        if in_order:
            first = in_order[0]
            if first.live == 0 or first.deadline_ms <= now_ms:
                return in_order.popleft()
        heap = self.heap
        if heap:
            top = heap[0]
            if top[2].live == 0 or top[0] <= now_ms:
                return heapq.heappop(heap)[2]
        return None

    def next_ms(self) -> int | None:
        """The earliest deadline of a lease that still holds something (settled leases at
        the front of the order are dropped on the way: advance would drop them too)."""
        in_order = self.in_order
        while in_order and in_order[0].live == 0:
            in_order.popleft()
        best = in_order[0].deadline_ms if in_order else None
        if self.heap:
            d = self.heap[0][0]
            best = d if best is None else min(best, d)
        return best


def grant(q: Queue, sub: Subscription, seq: int, grp: Group | None, now_ms: int) -> None:
    lease = sub.current
    if lease is None:
        if sub.lease_ms is None:
            lease = sub.current = Lease(sub, now_ms + q.settings.lease_ms, now_ms)
            q.lease_clock.add_in_order(lease)
        else:
            claim_ms = sub.lease_ms
            max_age = q.settings.max_lease_age_ms
            if max_age and claim_ms > max_age:
                claim_ms = max_age  # a claim's own lease: not past the queue's maximum age either
            lease = sub.current = Lease(sub, now_ms + claim_ms, now_ms)
            q.lease_clock.add(lease)
        if len(sub.leases) > 64:
            sub.leases = [x for x in sub.leases if x.live]
        sub.leases.append(lease)
    lease.seqs.append(seq)
    lease.live += 1
    q.lease_of[seq] = lease
    if q.last_holder:
        q.last_holder.pop(seq, None)
    m = q.meta.get(seq)
    if m is None:
        m = (grp.gid << G_SHIFT) if grp is not None else 0
    else:
        q.redelivered += 1
    m += 1
    q.meta[seq] = m
    sub.used += 1
    sub.out_seqs.append(seq)
    sub.out_deliveries.append(m & D_MASK)
    q.depth -= 1
    q.delivered += 1
    if q.fair_share is not None:
        rank = q.ranks.get(seq)
        if rank is not None:
            q.fair_share.dispatched(rank, q.depth == 0)
    if grp is not None:
        grp.inflight += 1
        if q.owned and grp.owner is None:
            grp.owner = sub
            sub.owned_groups.add(grp.gid)


def release(q: Queue, seq: int) -> tuple[Lease, int]:
    """Take ``seq`` out of its lease; free its subscription's credit and group slot."""
    lease = q.lease_of.pop(seq)
    lease.live -= 1
    sub = lease.sub
    sub.used -= 1
    if sub.pull:
        sub.backlog -= 1  # settling a claimed message opens no credit
    elif sub.waiting_groups:
        q.credit_opened(sub)
    m = q.meta[seq]
    gid = m >> G_SHIFT
    if gid:
        grp = q.groups[gid]
        grp.inflight -= 1
        grouping.settled(q, grp)
    q.dirty = True
    return lease, m


def renew(q: Queue, lease: Lease, deadline_ms: int) -> None:
    """Move what ``lease`` still holds to a new lease ending at ``deadline_ms``."""
    fresh = Lease(lease.sub, deadline_ms, lease.started_ms)
    lease_of = q.lease_of
    for seq in lease.seqs:
        if lease_of.get(seq) is lease:
            fresh.seqs.append(seq)
            lease_of[seq] = fresh
    fresh.live = len(fresh.seqs)
    lease.live = 0
    q.renewed += fresh.live
    sub = lease.sub
    if len(sub.leases) > 64:
        sub.leases = [x for x in sub.leases if x.live]
    sub.leases.append(fresh)
    q.lease_clock.add(fresh)


def extend(q: Queue, sub: Subscription, seqs: list[int], deadline_ms: int) -> list[int]:
    """Move ``seqs`` to a lease ending at ``deadline_ms`` (on a queue with a maximum
    lease age, not past it); returns those refused. Messages delivered at different
    times get a lease each: a lease keeps its messages' delivery time."""
    refused = []
    max_age = q.settings.max_lease_age_ms
    fresh: dict[int, Lease] = {}  # delivery time -> the new lease
    for seq in seqs:
        old = q.lease_of.get(seq)
        if old is None or old.sub is not sub:
            refused.append(seq)
            continue
        lease = fresh.get(old.started_ms)
        if lease is None:
            end = min(deadline_ms, old.started_ms + max_age) if max_age else deadline_ms
            lease = fresh[old.started_ms] = Lease(sub, end, old.started_ms)
        old.live -= 1
        lease.seqs.append(seq)
        lease.live += 1
        q.lease_of[seq] = lease
    for lease in fresh.values():
        sub.leases.append(lease)
        q.lease_clock.add(lease)
    return refused
