"""TargetQueueDepth: a queue keeps only its first N messages in memory.

A queue with ``target_queue_depth = N`` has an *active* part (waiting or leased, at
most N: deliverable, browsable, counted by views) and an *inactive* part that lives
in the journal only (``TargetDepth``, a queue's ``target``). The two are split by one
bookmark, ``cursor``: every
message of the queue below it was taken in (or early-acknowledged); every one at or
above it is inactive. Messages are taken in strictly in bookmark order, so the active
part is always the oldest unfinished messages and no per-message memory is spent on
the inactive ones; the engine counts them and reads them back through its *scan
port* (``scan(from_seq, limit)``: committed messages from a bookmark on) as the active
part drains.

An acknowledgment of an inactive message (``allow_ack_unleased``) is journaled at
once and remembered in ``early_acks`` until the scan passes it; recovery
rebuilds that set from the journaled acks above the cursor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mypy_extensions import trait

from zq.core import deadlines, delaying, entering
from zq.core import records as R

if TYPE_CHECKING:
    from collections.abc import Callable

    from zq.core.queue import Queue, Subscription

_SCAN_MIN = 256  # read at least this many records per scan: batch the journal reads
_SCAN_ROUNDS = 16  # scans per refill at most: other topics' records must not stall the loop


class TargetDepth:
    """One queue's split into its active part and its inactive part (see the module docstring)."""

    def __init__(self, q: Queue, limit: int) -> None:
        self.q = q
        self.limit = limit  # at most this many messages in memory (0: no target)
        self.inactive = 0  # messages of the queue in the journal only, at or above ``cursor``
        self.cursor = 0
        self.early_acks: set[int] = set()  # inactive messages acknowledged before they were read in
        self.scanning = False  # a refill stopped at its scan budget: go on at the next step
        self.due: dict[int, int] = {}  # delays of journal-only messages

    def admit(self, seq: int) -> bool:
        """Does new message ``seq`` go straight into the active part? If not, it stays in
        the journal only (counted, read back later in order)."""
        q = self.q
        if not self.inactive and q.active() < self.limit:
            self.cursor = seq + 1
            return True
        if not self.inactive:
            self.cursor = seq
        self.inactive += 1
        q.published += 1
        return False


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
        want = q.target.limit - q.active()
        scan = self.scan
        assert scan is not None
        q.target.scanning = False
        for _ in range(_SCAN_ROUNDS):
            if want <= 0 or not q.target.inactive:
                break
            batch = scan(q.target.cursor, max(want, _SCAN_MIN))
            if not batch:
                return  # the rest is not committed yet: a later step finds it
            for m in batch:
                q.target.cursor = m.seq + 1
                if not self.covered_by(q, m):
                    continue
                if q.target.early_acks and m.seq in q.target.early_acks:
                    q.target.early_acks.discard(m.seq)
                    continue
                q.target.inactive -= 1
                self.take_in(q, m)
                want -= 1
                if want == 0 or not q.target.inactive:
                    break
        else:
            q.target.scanning = bool(want > 0 and q.target.inactive)  # budget spent: the next step goes on
        if not q.target.inactive:
            q.target.cursor = max(q.target.cursor, self.next_seq)

    def take_in(self, q: Queue, m: R.Message) -> None:
        gid = 0
        if q.grouped:
            name = m.headers.get(q.settings.group_header)  # type: ignore[arg-type]
            if name is not None and q.can_take_group(name):
                gid = q.group_id(name)
        q.published -= 1  # counted when it was published, not again now
        entering.enqueue(q, m.seq, gid)
        if q.target.due:
            due = q.target.due.pop(m.seq, 0)
            if due > self.now_ms:  # its delay was journaled when it was published: not again
                delaying.mark(q, m.seq, gid, due, R.DELAY_PUBLISHED, journal=False)
        deadline = deadlines.deadline_of(m.headers)
        if deadline and not q.browse:
            q.deadlines.mark(m.seq, deadline)

    def ack_inactive(self, q: Queue, sub: Subscription, seq: int) -> bool:
        """An unleased ack of a message still in the journal only: remember and journal it."""
        if not (q.settings.allow_ack_unleased and q.target.inactive and seq >= q.target.cursor and seq < self.next_seq):
            return False
        if seq in q.target.early_acks:
            return False
        m = self.message(seq)  # type: ignore[attr-defined]
        if m is None or not self.covered_by(q, m):
            return False
        q.target.early_acks.add(seq)
        q.target.inactive -= 1
        q.acked += 1
        q.note_event(R.ACKED, sub.consumer, seq, 0)
        return True
