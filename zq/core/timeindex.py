"""The time index: when each bookmark was published, to the millisecond.

The engine keeps no publish time per message: one entry per millisecond in which
anything was published (its first bookmark) answers every question of age, by
bisection: which messages a queue's expiration has passed (the *watermark*), how
old the oldest waiting message is, and how long a message waited for its ack.
Entries below every queue's recovery point are dropped (``prune``), so its memory is
bounded by what still waits, not by what was ever published.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from typing import TYPE_CHECKING

from zq.core import inventory

if TYPE_CHECKING:
    from zq.core.queue import Queue

# Publish -> ack latency histogram bucket upper bounds (ms); the last bucket is +Inf.
ACK_LATENCY_BUCKETS_MS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10_000, 30_000, 60_000)


class TimeIndex:
    """Two parallel arrays: ``ms[i]`` is a millisecond in which something was published
    and ``seqs[i]`` the first bookmark published then (both increasing)."""

    def __init__(self) -> None:
        self.ms = array("q")
        self.seqs = array("Q")

    def note(self, now_ms: int, seq: int) -> None:
        """``seq`` was published at ``now_ms``: an entry only when the millisecond is new."""
        if not self.ms or now_ms > self.ms[-1]:
            self.ms.append(now_ms)
            self.seqs.append(seq)

    def watermark_at(self, q: Queue, at_ms: int, next_seq: int) -> int:
        """Highest seq published at or before ``at_ms`` - ``q``'s expiration (-1: none)."""
        e = q.settings.expiration_ms
        if not e or not self.ms:
            return -1
        i = bisect_right(self.ms, at_ms - e)
        if i == 0:
            return -1
        return self.seqs[i] - 1 if i < len(self.seqs) else next_seq - 1

    def publish_time_ms(self, seq: int, now_ms: int) -> int:
        """When ``seq`` was published (``now_ms`` when the index no longer knows)."""
        i = bisect_right(self.seqs, seq) - 1
        return self.ms[i] if i >= 0 else now_ms

    def prune(self, lowest_seq: int) -> None:
        """Forget publish times of finished messages (keeps memory bounded by what waits)."""
        i = bisect_right(self.seqs, lowest_seq) - 1  # keep the entry covering lowest_seq
        if i > 1024:
            del self.ms[:i]
            del self.seqs[:i]

    def next_expiry_ms(self, q: Queue, now_ms: int) -> int | None:
        """When ``q``'s advance may next expire a message by age: its oldest message where
        every advance looks, or its next sweep (group lists, the ordered heap, sleepers:
        looked at once per sweep interval, at the first advance after it is due)."""
        e = q.settings.expiration_ms
        if not e or not q.depth or not self.ms:
            return None
        # Nothing in ``q`` is older than its last recovery point (0: not computed yet), so
        # nothing expires before that was published + e: a day-long expiration is not
        # swept every second for a day.
        i = bisect_right(self.seqs, q.rp) - 1
        best = max(q.group_sweep_due_ms, self.ms[max(i, 0)] + e)
        # Ordered queues: the heap's are found by the sweep; those set aside by filters at every advance.
        oldest = q.aside.oldest() if q.ordered else inventory.oldest_waiting_ungrouped(q)
        if oldest is not None:
            i = bisect_right(self.seqs, oldest) - 1
            best = min(best, self.ms[i] + e if i >= 0 else now_ms + e)
        return best

    def count_acks(self, q: Queue, seqs: list[int], now: int, next_seq: int) -> None:
        """Add the publish -> ack latencies of ``seqs`` (acked at ``now``) to ``q``'s figures.
        Seqs published in the same millisecond share one entry, so a batch mostly needs
        one bisect, not one per message."""
        hist, edges, exact = q.ack_latency, ACK_LATENCY_BUCKETS_MS, q.ack_latency_ms
        ti_seq, ti_ms = self.seqs, self.ms
        lo = hi = -1  # ti_seq[i] <= seq < hi shares entry i, whose latency is ``latency``
        latency = bucket = total = run = 0
        for seq in seqs:
            if not lo <= seq < hi:
                if run:  # the run of seqs sharing the previous entry: counted at once
                    hist[bucket] += run
                    key = latency_key(latency)
                    exact[key] = exact.get(key, 0) + run
                    total += latency * run
                i = bisect_right(ti_seq, seq) - 1
                latency = now - ti_ms[i] if i >= 0 else 0
                bucket = bisect_left(edges, latency)
                lo = ti_seq[i] if i >= 0 else 0
                hi = ti_seq[i + 1] if i + 1 < len(ti_seq) else next_seq
                run = 0
            run += 1
        if run:
            hist[bucket] += run
            key = latency_key(latency)
            exact[key] = exact.get(key, 0) + run
            total += latency * run
        q.ack_latency_sum_ms += total


def latency_key(ms: int) -> int:
    """A measured latency kept to two significant digits (137 ms -> 130, 4,180 -> 4,100;
    under 100 ms exact): at most 90 keys a decade, so ``zq top`` shows measured p50 and
    p99 within 10 % instead of the coarse histogram's bucket edges."""
    if ms < 100:
        return ms
    scale = 10 ** (len(str(ms)) - 2)
    return ms // scale * scale
