"""browse_only queues: each subscription walks the messages in order from its own cursor
(``Subscription.browse_cursor``); nothing is leased and nothing leaves. Credit bounds
what is in flight to a browser, and a settle only gives its credit back (Qpid's browse
mode, AMPS's ``peek``-style queues).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from typing import TYPE_CHECKING

from zq.core import removal

if TYPE_CHECKING:
    from zq.core.queue import Queue, Subscription


def dispatch(q: Queue, budget: int) -> None:
    """browse_only: each subscription walks the messages in order from its own cursor;
    nothing is leased and nothing leaves. Credit bounds what is in flight to it."""
    if len(q.removed) > 1024 and len(q.removed) * 2 > len(q.fifo) - q.head:
        compact_removed(q)
    fifo, removed = q.fifo, q.removed
    for sub in q.subs:
        if sub.used >= sub.backlog:
            continue
        i = bisect_left(fifo, max(sub.browse_cursor, 0), lo=q.head)
        n = len(fifo)
        while i < n and sub.used < sub.backlog:
            seq = fifo[i]
            if sub.match is not None:
                if q.matches >= budget:
                    q.stop_for_budget()
                    return
                q.matches += 1
            i += 1
            sub.browse_cursor = seq + 1
            if seq in removed or (sub.match is not None and not sub.match(seq)):
                continue
            sub.out_seqs.append(seq)
            sub.out_deliveries.append(1)
            sub.browse_out.add(seq)
            sub.used += 1
            q.delivered += 1


def compact_removed(q: Queue) -> None:
    """Take removed messages (LVQ replacements, purges) out of the fifo's middle: in a
    browse queue nothing else ever moves them to the front."""
    live = array("Q")
    removed = q.removed
    for seq in q.fifo[q.head:]:
        if seq in removed:
            removal.drop_removed(q, seq, 0)
        else:
            live.append(seq)
    q.fifo, q.head = live, 0


def settle(q: Queue, sub: Subscription, seq: int) -> str | None:
    """A browser settles a message: only its credit comes back."""
    if seq not in sub.browse_out:
        return "not-leased"
    sub.browse_out.discard(seq)
    sub.used -= 1
    q.dirty = True
    return None
