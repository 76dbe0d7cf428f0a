"""Message deadlines: a publish's ``ttl`` (or ``expires_at``) gives each of its messages a
time by which it must have been delivered (SQS retention, AMQP per-message TTL).

The rule (docs/protocol.md): a message still *waiting* at its deadline expires with
reason ``ttl`` and is dead-lettered with its context; one delivered before it is not cut
short (its holder may still ack it), but if that delivery ends unfinished after the
deadline (cancel, lease expiry, consumer gone) the message expires then instead of
going again. A queue's ``expiration`` applies as well: the sooner of the two wins.

The deadline travels with the message as the reserved header ``zq.expires_at`` (Unix
ms), written by the dispatcher (clients may not send ``zq.`` headers), so recovery,
TargetQueueDepth's read-in and a standby all see it with the message; a dead letter,
a move or a redrive drops it. Nothing is kept for a queue whose messages have none:
``due`` and ``heap`` stay empty and each message costs one dict lookup where it enters.
The heap's stale entries (messages finished before their deadline) are compacted once
they outnumber the live ones, so memory follows the messages still in the queue.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from zq.core import removal
from zq.core import records as R

if TYPE_CHECKING:
    from zq.core.queue import Queue

HEADER = "zq.expires_at"  # Unix ms: the message's deadline (written by the dispatcher only)
COMPACT_MIN = 1024  # stale heap entries tolerated before a compaction is considered


def deadline_of(headers: dict[str, str]) -> int:
    """A journaled message's deadline (0: none). A malformed value is no deadline: only
    the dispatcher writes the header, and a message must never fail on it."""
    text = headers.get(HEADER) if headers else None
    if text is None:
        return 0
    try:
        return max(int(text), 0)
    except ValueError:
        return 0


class Deadlines:
    """The deadlines of one queue's messages that have one (see the module docstring)."""

    def __init__(self, q: Queue) -> None:
        self.q = q
        self.due: dict[int, int] = {}  # seq -> deadline (Unix ms), while the message is in the queue
        self.heap: list[tuple[int, int]] = []  # (deadline, seq); stale once ``due`` no longer has it
        self.overdue: set[int] = set()  # leased at their deadline: they expire if they come back
        self.expired = 0  # messages expired by their deadline (stats)

    def mark(self, seq: int, deadline_ms: int) -> None:
        self.due[seq] = deadline_ms
        heapq.heappush(self.heap, (deadline_ms, seq))
        self.q.dirty = True

    def finished(self, seq: int) -> None:
        """``seq`` left the queue: its deadline goes (its heap entry is stale from now on)."""
        self.due.pop(seq, None)
        if self.overdue:
            self.overdue.discard(seq)
        stale = len(self.heap) - len(self.due)
        if stale > COMPACT_MIN and stale > 2 * len(self.due):
            self.heap = [(d, s) for s, d in self.due.items()]
            heapq.heapify(self.heap)

    def next_ms(self) -> int | None:
        """The earliest deadline (perhaps of a finished message: waking for it is cheap)."""
        return self.heap[0][0] if self.heap else None

    def expire_due(self, now_ms: int) -> None:
        """Messages whose deadline came: a waiting one expires (reason ``ttl``); a leased
        one is marked overdue and expires if its delivery ends unfinished."""
        q, heap, due = self.q, self.heap, self.due
        while heap and heap[0][0] <= now_ms:
            when, seq = heapq.heappop(heap)
            if due.get(seq) != when:
                continue  # finished since
            del due[seq]
            if seq in q.lease_of:
                self.overdue.add(seq)
                continue
            deliveries, group = q.deliveries_of(seq), q.group_name_of(seq)
            # Still here, not leased, not removed (removal drops its deadline): it waits, so no
            # search for it (an ordered queue's would scan its heap, once per message).
            if removal.remove_available(q, seq, known_waiting=True):
                self.expired += 1
                q.expired += 1
                q.expired_out.append((seq, R.REASON_TTL, deliveries, group))
                q.dirty = True

    def expire_overdue(self, seq: int) -> bool:
        """``seq``'s delivery ended unfinished: True if its deadline passed meanwhile (the
        caller expires it with reason ``ttl`` instead of putting it back)."""
        if seq in self.overdue:
            self.overdue.discard(seq)
            self.expired += 1
            return True
        return False
