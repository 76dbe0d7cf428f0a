"""What runs out with time in a queue: leases past their deadline, and messages older
than the queue's ``expiration``.

Expiration never stores a timestamp per message: sequence numbers grow with time, so
the engine keeps a time index (ms -> first sequence number published at or after it) and
a message is too old exactly when its sequence number is at or below the queue's
*expired watermark* (``Queue.expired_watermark``). The fronts of the fifo and the
returned heap are checked at every advance (their oldest is first); group pending lists,
``sleeping`` and an ordered queue's heap, where old messages may sit anywhere, are swept
at most once per ``limits.EXPIRY_SWEEP_INTERVAL_MS``.

A lease that runs out on a queue with ``max_lease_age`` is renewed instead while its
holder is connected (a session that stops heartbeating is dropped, and its leases with
it), never past the delivery's maximum age.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from zq.core import grouping, leases, limits, removal, settling
from zq.core import records as R
from zq.core.ordering import SEQ_MASK

if TYPE_CHECKING:
    from zq.core.queue import Lease, Queue


def expire_lease(q: Queue, lease: Lease, now_ms: int) -> None:
    if lease.live == 0:
        return
    max_age = q.settings.max_lease_age_ms
    if max_age and lease.started_ms + max_age > now_ms:
        # Session-wide renewal: its holder is still connected (a session that stops
        # heartbeating is dropped, and its leases with it), so the lease goes on for
        # another period, never past the delivery's maximum age.
        period = lease.sub.lease_ms or q.settings.lease_ms
        leases.renew(q, lease, min(now_ms + period, lease.started_ms + max_age))
        return
    for seq in lease.seqs:
        if q.lease_of.get(seq) is lease:
            settling.end_lease_of(q, seq, R.LEASE_EXPIRED, now_ms)


def expire_old(q: Queue, watermark: int, now_ms: int) -> None:
    """Expire too-old messages wherever they wait; no subscriber needed.

    The fifo and the returned heap are checked every time (their oldest is at the
    front); group pending lists are swept at most once per sweep interval.
    """
    fifo = q.fifo
    while q.head < len(fifo) and fifo[q.head] <= watermark:
        seq = fifo[q.head]
        gid = q.fifo_gid[q.head] if q.grouped else 0
        q.head += 1
        if seq in q.removed:
            removal.drop_removed(q, seq, gid)
            continue
        q.depth -= 1
        q.expire_waiting(seq, gid, R.REASON_EXPIRED)
    while not q.ordered and q.returned and q.returned[0] <= watermark:
        seq = heapq.heappop(q.returned)
        if seq in q.removed:
            removal.drop_removed(q, seq, 0)
            continue
        q.depth -= 1
        q.expire_waiting(seq, 0, R.REASON_EXPIRED)
    if q.aside.keys:
        q.aside.expire(watermark)
    if now_ms < q.group_sweep_due_ms:
        q.compact()
        q.dirty = True
        return
    q.group_sweep_due_ms = now_ms + limits.EXPIRY_SWEEP_INTERVAL_MS
    if q.ordered:
        expire_heap(q, watermark)
    if q.sleeping:
        for key in sorted(k for k in q.sleeping if k & SEQ_MASK <= watermark):
            q.sleeping.discard(key)
            q.depth -= 1
            q.expire_waiting(key & SEQ_MASK, 0, R.REASON_EXPIRED)
    for grp in list(q.groups.values()):
        popped = False
        while grp.has_pending() and grp.pending[grp.phead] <= watermark:
            seq = grp.pending[grp.phead]
            grp.phead += 1
            popped = True
            if seq in q.removed:
                removal.drop_removed(q, seq, grp.gid)
                continue
            q.depth -= 1
            q.expire_waiting(seq, grp.gid, R.REASON_EXPIRED)
        if grp.gid in q.groups:
            grouping.after_pop(q, grp)
            if popped and grp.has_pending():
                grouping.became_pending(q, grp)  # an expired head may have parked it
            grouping.maybe_forget(q, grp)
    q.compact()
    q.dirty = True


def expire_heap(q: Queue, watermark: int) -> None:
    """Ordered queues: too-old messages may sit anywhere in the heap; one pass per
    sweep interval takes them all out."""
    if not q.returned or q.heap_oldest is not None and q.heap_oldest > watermark:
        return
    keep = []
    for key in q.returned:
        seq = key & SEQ_MASK
        if seq > watermark:
            keep.append(key)
        elif seq in q.removed:
            removal.drop_removed(q, seq, 0)
        else:
            q.depth -= 1
            q.expire_waiting(seq, 0, R.REASON_EXPIRED)
    heapq.heapify(keep)
    q.returned = keep
    q.heap_oldest = None
