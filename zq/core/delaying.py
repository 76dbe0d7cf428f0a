"""Delays: messages that may not go before a time (a retry's backoff, a publish's delay).

Delayed messages wait in their usual places and are marked (seq -> due ms) with a timer
each (``DelayTimer``). Dispatch moves a marked message it meets into its group's pending
list (where, as the group's head, it *parks* the group: that group waits, no other does)
or, ungrouped, into ``Queue.sleeping``; ``wake_due`` puts it back in its original place
at its due time. The retry schedule (``backoff_ms``) is spread by a hash of (message,
delivery), not a random draw: the engine stays deterministic, and retries of many
messages still spread out.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from zq.core import grouping
from zq.core.leases import D_MASK


if TYPE_CHECKING:
    from zq.core.queue import Queue



class DelayTimer:
    """Messages that may not go before a time (a retry's backoff, a publish's delay; the
    theory of operation's "Delayed messages"). ``due`` marks each such message while it
    waits in its place: seq -> (due ms, group id); ``heap`` holds the timers, (due ms,
    seq), stale once their mark is gone or was set again."""

    __slots__ = ("due", "heap")

    def __init__(self) -> None:
        self.due: dict[int, tuple[int, int]] = {}
        self.heap: list[tuple[int, int]] = []

    def mark(self, seq: int, gid: int, due_ms: int) -> None:
        self.due[seq] = (due_ms, gid)
        heapq.heappush(self.heap, (due_ms, seq))

    def any_due(self, now_ms: int) -> bool:
        return bool(self.heap) and self.heap[0][0] <= now_ms

    def take_due(self, now_ms: int) -> list[tuple[int, int]]:
        """The marks whose time came by ``now_ms``, as (seq, group id), taken off."""
        heap, due = self.heap, self.due
        out: list[tuple[int, int]] = []
        while heap and heap[0][0] <= now_ms:
            when, seq = heapq.heappop(heap)
            entry = due.get(seq)
            if entry is None or entry[0] != when:
                continue  # settled, removed or delayed again since
            del due[seq]
            out.append((seq, entry[1]))
        return out

    def next_ms(self) -> int | None:
        """The earliest timer (perhaps stale: waking for it finds nothing, and is cheap)."""
        return self.heap[0][0] if self.heap else None


def retry_delay_ms(q: Queue, seq: int, deliveries: int) -> int:
    """The schedule's wait after delivery ``deliveries`` failed, spread by the
    jitter. The spread is a hash of (message, delivery), not a random draw: the
    engine stays deterministic, and retries of many messages still spread out."""
    steps = q.backoff
    base = steps[min(max(deliveries, 1), len(steps)) - 1]
    spread = int(base * q.settings.backoff_jitter)
    if spread <= 0:
        return base
    h = ((seq * 0x9E3779B97F4A7C15) ^ (deliveries * 0xBF58476D1CE4E5B9)) & 0xFFFFFFFF
    return base - spread + ((h * (2 * spread + 1)) >> 32)


def mark(q: Queue, seq: int, gid: int, due_ms: int, reason: str, journal: bool = True) -> None:
    """``seq``, waiting in its place, may not go before ``due_ms``."""
    q.delays.mark(seq, gid, due_ms)
    if journal:
        q.delays_out.append((seq, q.meta.get(seq, 0) & D_MASK, due_ms, reason))
    q.dirty = True


def wake_due(q: Queue, now_ms: int) -> None:
    """Delayed messages whose time came go back to their places."""
    for seq, gid in q.delays.take_due(now_ms):
        q.dirty = True
        if gid:
            grp = q.groups.get(gid)
            if grp is not None and grp.has_pending() and grp.pending[grp.phead] == seq:
                grouping.became_pending(q, grp)  # the parked group goes on
            continue
        key = q.ranks.get(seq, -1) if q.ordered else seq
        if key in q.sleeping:  # else still in the fifo (or heap), unreached: it simply goes
            q.sleeping.discard(key)
            if q.ordered:
                del q.ranks[seq]
                if q.heap_oldest is not None and seq < q.heap_oldest:
                    q.heap_oldest = seq
            heapq.heappush(q.returned, key)


def due_of(q: Queue, seq: int) -> int | None:
    """When a delayed message may go (Unix ms), or None."""
    entry = q.delays.due.get(seq)
    return entry[0] if entry is not None else None
