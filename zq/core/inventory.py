"""Where a queue's messages wait, read without changing where they wait: for peek,
operator actions, recovery points, ``zq top`` and the checkers (``oldest_in_heap``
keeps a cache, ``Queue.heap_oldest``).

A queue keeps its waiting messages in several ordered places (``zq.core.queue``'s theory
of operation: the fifo, the returned heap, group pending lists, the set-aside list,
``sleeping``); each reader here merges or scans them. None of them is on the dispatch
path: dispatch reads the places' fronts itself, and these may cost a scan.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from itertools import repeat
from typing import TYPE_CHECKING

from zq.core.ordering import NO_RANK, SEQ_MASK

if TYPE_CHECKING:
    from collections.abc import Iterator

    from zq.core.queue import Queue



def heap_in_order(heap: list[int]) -> Iterator[int]:
    """A heap's items in order, lazily: a peek at the first few of a deep heap is cheap."""
    heap = list(heap)
    while heap:
        yield heapq.heappop(heap)


def waiting(q: Queue) -> Iterator[int]:
    """Waiting sequence numbers in delivery order (read-only view, for peek); in an
    ordered queue, by rank (a group's messages by their own ranks)."""
    sources = [iter(q.fifo[q.head:]), heap_in_order(q.returned), iter(q.aside.live()),
               iter(sorted(q.sleeping))]
    if q.ordered:
        ranks = q.ranks
        sources += [iter(sorted(ranks[s] for s in g.pending[g.phead:])) for g in q.groups.values()
                    if g.has_pending()]
    else:
        sources += [iter(g.pending[g.phead:]) for g in q.groups.values() if g.has_pending()]
    removed = q.removed
    for key in heapq.merge(*sources):
        seq = key & SEQ_MASK
        if seq not in removed:
            yield seq


def waiting_between(q: Queue, after: int, end: int, gid: int | None = None) -> Iterator[tuple[int, int]]:
    """Waiting messages with bookmarks in (``after``, ``end``), in bookmark order, as
    (bookmark, group id); with ``gid``, one group's only (0: messages of no group).

    What a bulk operator action reads one slice at a time: the fifo and each group's
    pending list are sorted, so a slice costs one bisect each, a pass over the
    (usually short) returned heap and set-aside list, and what it takes."""
    removed = q.removed
    sources: list[Iterator[tuple[int, int]]] = []
    fifo, head = q.fifo, q.head
    lo = bisect_right(fifo, after, lo=head)
    hi = bisect_left(fifo, end, lo=lo)
    if lo < hi:
        if q.grouped:
            fifo_gid = q.fifo_gid
            sources.append((fifo[i], fifo_gid[i]) for i in range(lo, hi) if gid is None or fifo_gid[i] == gid)
        elif not gid:
            sources.append(zip(fifo[lo:hi], repeat(0)))
    if not gid and q.returned:  # the heap holds messages of no group only
        sources.append(iter(sorted((s, 0) for s in (k & SEQ_MASK for k in q.returned) if after < s < end)))
    if not gid and q.sleeping:  # so does ``sleeping``
        sources.append(iter(sorted((s, 0) for s in (k & SEQ_MASK for k in q.sleeping) if after < s < end)))
    if q.aside.keys:
        sources.append(iter(sorted((k & SEQ_MASK, g) for k, g in q.aside.live_with_groups()
                                   if after < k & SEQ_MASK < end and (gid is None or g == gid))))
    groups = q.groups.values() if gid is None else [q.groups[gid]] if gid in q.groups else []
    for grp in groups:
        if grp.has_pending():
            pending, g = grp.pending, grp.gid
            a = bisect_right(pending, after, lo=grp.phead)
            b = bisect_left(pending, end, lo=a)
            if a < b:
                sources.append(zip(pending[a:b], repeat(g)))
    for seq, g in heapq.merge(*sources):
        if seq not in removed:
            yield seq, g


def waiting_set(q: Queue) -> set[int]:
    """Waiting sequence numbers, unordered (for checkers: cheaper than ``waiting``)."""
    out = set(q.fifo[q.head:])
    out.update(k & SEQ_MASK for k in q.sleeping)
    if q.ordered:
        out.update(k & SEQ_MASK for k in q.returned)
        out.update(k & SEQ_MASK for k in q.aside.live())
    else:
        out.update(q.returned)
        out.update(q.aside.live())
    for g in q.groups.values():
        if g.has_pending():
            out.update(g.pending[g.phead:])
    out -= q.removed
    return out


def oldest_waiting(q: Queue) -> int | None:
    """The oldest waiting message anywhere (fifo, returned, group pending lists)."""
    oldest = oldest_waiting_ungrouped(q)
    for g in q.groups.values():
        if g.has_pending() and (oldest is None or g.pending[g.phead] < oldest):
            oldest = g.pending[g.phead]
    return oldest


def oldest_waiting_ungrouped(q: Queue) -> int | None:
    """Oldest waiting message outside group pending lists (for expiry timers)."""
    best = oldest_ungrouped_awake(q)
    if q.sleeping:
        asleep = min(k & SEQ_MASK for k in q.sleeping)
        if best is None or asleep < best:
            best = asleep
    return best


def oldest_ungrouped_awake(q: Queue) -> int | None:
    if q.ordered:
        best = oldest_in_heap(q)
        aside = q.aside.oldest()
        return aside if best is None or aside is not None and aside < best else best
    best = q.fifo[q.head] if q.head < len(q.fifo) else None
    if q.returned and (best is None or q.returned[0] < best):
        best = q.returned[0]
    aside = q.aside.oldest()
    if aside is not None and (best is None or aside < best):
        best = aside
    return best


def oldest_in_heap(q: Queue) -> int | None:
    """Ordered queues: the oldest message in the heap. A scan, cached until that
    message leaves the heap (pushes only ever bring the oldest down)."""
    if q.heap_oldest is None:
        removed = q.removed
        q.heap_oldest = min((k & SEQ_MASK for k in q.returned if k & SEQ_MASK not in removed), default=NO_RANK)
    return None if q.heap_oldest == NO_RANK else q.heap_oldest


def compute_recovery_point(q: Queue, next_seq: int) -> int:
    """The smallest sequence number still in the queue (waiting or leased)."""
    oldest = oldest_waiting(q)
    rp = next_seq if oldest is None else min(next_seq, oldest)
    if q.lease_of:
        rp = min(rp, min(q.lease_of))
    if q.removed:
        rp = min(rp, min(q.removed))
    if q.target.inactive or q.target.early_acks:
        rp = min(rp, q.target.cursor)
    return rp


def group_summary(q: Queue, top: int = 5, scan_max: int = 100_000) -> dict:
    """Groups in flight and the busiest ones (scans at most ``scan_max`` groups)."""
    inflight = 0
    busiest: list[tuple[int, str, str | None]] = []
    for i, g in enumerate(q.groups.values()):
        if i >= scan_max:
            break
        if g.inflight:
            inflight += 1
        pending = g.count - g.inflight  # waiting anywhere: parked or still in the fifo
        if pending:
            busiest.append((pending, g.name, g.owner.consumer if g.owner is not None else None))
    busiest.sort(key=lambda x: (-x[0], x[1]))
    return {
        "count": len(q.groups),
        "in_flight": inflight,
        "busiest": [{"group": n, "pending": p, "owner": o} for p, n, o in busiest[:top]],
        "scanned": min(len(q.groups), scan_max),
    }
