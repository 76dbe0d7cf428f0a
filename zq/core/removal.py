"""Taking waiting messages out of the middle of a queue: an operator's purge or delete,
a last-value replacement, an ack of an unleased message, a ring overflow's drop.

A removed message is *marked* (``Queue.removed``) and left where it waits: dispatch,
expiry and the sweeps drop it when they reach it (``drop_removed``), so a removal costs a
set insert, not a search of every place. It stops counting at once: in the queue's depth
and bytes, and in its group's count (``removed_gid``), so ``zq top`` agrees with a purge
at once. A set-aside message is taken out at once instead (it may hold its group), and a
delayed one asleep outside every place simply finishes.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from typing import TYPE_CHECKING

from zq.core import grouping
from zq.core.ordering import SEQ_MASK

if TYPE_CHECKING:
    from zq.core.queue import Queue


def drop_removed_front(q: Queue) -> None:
    """Finish removed messages at the front of the fifo and the returned heap, so the
    oldest waiting message there is a live one."""
    removed = q.removed
    if not removed:
        return
    fifo = q.fifo
    while q.head < len(fifo) and fifo[q.head] in removed:
        gid = q.fifo_gid[q.head] if q.grouped else 0
        seq = fifo[q.head]
        q.head += 1
        drop_removed(q, seq, gid)
    while q.returned and q.returned[0] & SEQ_MASK in removed:
        seq = heapq.heappop(q.returned) & SEQ_MASK
        if seq == q.heap_oldest:
            q.heap_oldest = None
        drop_removed(q, seq, 0)


def remove_available(q: Queue, seq: int, known_waiting: bool = False, gid: int = 0) -> bool:
    """Mark a waiting message removed (it is skipped when reached).

    ``known_waiting``: the caller knows ``seq`` waits in this queue, which spares an
    ordered queue a scan of its heap. ``gid``: its group, when the caller knows it
    (``waiting_between``): the group stops counting it now, not when it is reached, so
    ``groups`` and ``zq top`` agree with a purge at once."""
    if seq in q.removed or seq in q.lease_of:
        return False
    parked = 0  # the group this message parks (as its delayed head), to go on without it
    if q.delays.due and seq in q.delays.due:
        _, parked = q.delays.due.pop(seq)
        asleep = q.ranks.get(seq, -1) if q.ordered else seq
        if asleep in q.sleeping:
            q.sleeping.discard(asleep)
            q.depth -= 1
            q.finish(seq, 0)
            q.dirty = True
            return True
        known_waiting = True
    if not known_waiting and not is_waiting(q, seq):
        return False
    key = q.ranks.get(seq) if q.ordered else seq
    if key is not None and q.aside.take_out(seq, key):
        return True
    q.removed.add(seq)
    if gid and gid in q.groups:
        q.groups[gid].count -= 1
        q.removed_gid[seq] = gid
    if parked:
        grp = q.groups.get(parked)
        if grp is not None and grp.has_pending() and grp.pending[grp.phead] == seq:
            grouping.became_pending(q, grp)  # dispatch drops the removed head and goes on
    q.depth -= 1
    if seq == q.heap_oldest:
        q.heap_oldest = None
    q.overflow.forget(seq)  # now, not when its removal is reached
    if q.deadlines.due:
        q.deadlines.finished(seq)  # (it never goes again: its deadline is moot)
    return True


def is_waiting(q: Queue, seq: int) -> bool:
    if q.ordered:  # parked, set aside, asleep or leased (the caller excludes leased), or in the heap
        return seq in q.ranks or any(k & SEQ_MASK == seq for k in q.returned)
    if seq in q.sleeping:
        return True
    i = bisect_left(q.fifo, seq, lo=q.head)
    if i < len(q.fifo) and q.fifo[i] == seq:
        return True
    if seq in q.returned:
        return True
    if q.aside.index_of(seq) >= 0:
        return True
    return any(seq in g.pending[g.phead:] for g in q.groups.values() if g.has_pending())


def drop_removed(q: Queue, seq: int, gid: int) -> None:
    q.removed.discard(seq)
    counted = q.removed_gid.pop(seq, 0) if q.removed_gid else 0
    if counted:  # its group stopped counting it when it was removed
        q.finish(seq, 0)
        grp = q.groups.get(counted)
        if grp is not None:
            grouping.maybe_forget(q, grp)
        return
    q.finish(seq, gid)
