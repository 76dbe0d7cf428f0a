"""Barriers: a message matching the queue's ``barrier`` expression waits until every
earlier message is acknowledged, then goes to every subscriber whose filter matches (no
lease, no credit) and leaves the queue; nothing later goes before it (docs/protocol.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zq.core import records as R
from zq.core.expr import compile_filter

if TYPE_CHECKING:
    from zq.core.queue import Queue
    from zq.core.settings import QueueSettings


class Barriers:
    """The waiting barrier messages of one queue, oldest first."""

    def __init__(self, q: Queue, s: QueueSettings) -> None:
        self.q = q
        self.fn = compile_filter(s.barrier).fn if s.barrier else None
        self.waiting: list[int] = []
        self.released = 0

    def gate(self, candidate: int) -> bool | None:
        """Before dispatching ``candidate``: False to go on, True to stop (the oldest
        barrier is next and earlier messages are still out), None after releasing it or
        dropping a stale one (purged, expired, or already passed): look again."""
        q = self.q
        b = self.waiting[0]
        if b in q.removed or b <= q.expired_watermark or b < candidate:
            self.waiting.pop(0)  # purged, expired or otherwise gone: no longer a barrier
            return None
        if candidate < b:
            return False
        if q.lease_of and min(q.lease_of) < b:
            return True
        if q.delays.due and min(q.delays.due) < b:
            return True  # an earlier message waits for its retry: it is not acknowledged either
        self.waiting.pop(0)
        q.head += 1  # ungrouped and never leased: it is the fifo's head
        q.depth -= 1
        for sub in q.subs:
            if sub.match is None or sub.match(b):
                sub.barrier_out.append(b)
        q.finish(b, 0)
        self.released += 1
        q.expired_out.append((b, R.REASON_BARRIER, 0, None))
        return None
