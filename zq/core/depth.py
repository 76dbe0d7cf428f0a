"""TargetQueueDepth: a queue keeps only its first N messages in memory.

A queue with ``target_queue_depth = N`` has an *active* part (waiting or leased, at
most N: deliverable, browsable, counted by views) and an *inactive* part that lives
in the journal only. The two are split by one bookmark, ``Queue.tqd_cursor``: every
message of the queue below it was taken in (or early-acknowledged); every one at or
above it is inactive. Messages are taken in strictly in bookmark order, so the active
part is always the oldest unfinished messages and no per-message memory is spent on
the inactive ones; the engine counts them and reads them back through its *scan
port* (``scan(from_seq, limit)``: committed messages from a bookmark on) as the active
part drains.

An acknowledgment of an inactive message (``allow_ack_unleased``) is journaled at
once and remembered in ``Queue.early_acks`` until the scan passes it; recovery
rebuilds that set from the journaled acks above the cursor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mypy_extensions import trait

from zq.core import delaying, entering
from zq.core import records as R

if TYPE_CHECKING:
    from collections.abc import Callable

    from zq.core.queue import Queue, Subscription

_SCAN_MIN = 256  # read at least this many records per scan: batch the journal reads
_SCAN_ROUNDS = 16  # scans per refill at most: other topics' records must not stall the loop


@trait  # mypyc: a compiled class may mix in traits only
class TargetDepthMixin:
    """Engine methods for queues with a target depth (mixed into ``Engine``)."""

    scan: Callable[[int, int], list[R.Message]] | None
    next_seq: int
    now_ms: int

    def covered_by(self, q: Queue, m: R.Message) -> bool:
        """Does ``m`` (read back from the journal) belong to ``q``?"""
        if m.seq < q.settings.start_seq or not q.covers(m.topic):
            return False
        return q.filter is None or q.filter(m.headers, m.payload, m.topic)

    def refill(self, q: Queue) -> None:
        """Take inactive messages in, oldest first, until the active part is full again."""
        want = q.tqd - q.active()
        scan = self.scan
        assert scan is not None
        q.tqd_scanning = False
        for _ in range(_SCAN_ROUNDS):
            if want <= 0 or not q.inactive:
                break
            batch = scan(q.tqd_cursor, max(want, _SCAN_MIN))
            if not batch:
                return  # the rest is not committed yet: a later step finds it
            for m in batch:
                q.tqd_cursor = m.seq + 1
                if not self.covered_by(q, m):
                    continue
                if q.early_acks and m.seq in q.early_acks:
                    q.early_acks.discard(m.seq)
                    continue
                q.inactive -= 1
                self.take_in(q, m)
                want -= 1
                if want == 0 or not q.inactive:
                    break
        else:
            q.tqd_scanning = bool(want > 0 and q.inactive)  # budget spent: the next step goes on
        if not q.inactive:
            q.tqd_cursor = max(q.tqd_cursor, self.next_seq)

    def take_in(self, q: Queue, m: R.Message) -> None:
        gid = 0
        if q.grouped:
            name = m.headers.get(q.settings.group_header)  # type: ignore[arg-type]
            if name is not None and q.can_take_group(name):
                gid = q.group_id(name)
        q.published -= 1  # counted when it was published, not again now
        entering.enqueue(q, m.seq, gid)
        if q.inactive_due:
            due = q.inactive_due.pop(m.seq, 0)
            if due > self.now_ms:  # its delay was journaled when it was published: not again
                delaying.mark(q, m.seq, gid, due, R.DELAY_PUBLISHED, journal=False)

    def ack_inactive(self, q: Queue, sub: Subscription, seq: int) -> bool:
        """An unleased ack of a message still in the journal only: remember and journal it."""
        if not (q.settings.allow_ack_unleased and q.inactive and seq >= q.tqd_cursor and seq < self.next_seq):
            return False
        if seq in q.early_acks:
            return False
        m = self.message(seq)  # type: ignore[attr-defined]
        if m is None or not self.covered_by(q, m):
            return False
        q.early_acks.add(seq)
        q.inactive -= 1
        q.acked += 1
        q.note_event(R.ACKED, sub.consumer, seq, 0)
        return True
