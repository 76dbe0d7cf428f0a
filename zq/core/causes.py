"""Why a message's deliveries ended unfinished, by cause: cancelled, failed (a cancel
naming an error), lease expired, consumer gone. Kept only for messages that had such an
end (journaled as events, rebuilt by recovery) and carried by their dead letters; each
cause may have its own limit that dead-letters (``max_failures``,
``max_lease_expiries``, ``max_consumer_gone``), beside ``max_deliveries``.
"""

from __future__ import annotations

from zq.core import records as R
from zq.core.settings import QueueSettings


class Causes:
    """Why a message's deliveries ended unfinished, by cause: kept only for messages
    that had such an end (journaled as events, rebuilt by recovery), and carried by
    their dead letters."""

    __slots__ = ("cancelled", "failed", "lease_expired", "consumer_gone", "last_error", "last_consumer",
                 "first_ms", "last_ms")

    def __init__(self, now_ms: int) -> None:
        self.cancelled = 0  # cancels without an error
        self.failed = 0  # cancels naming an error
        self.lease_expired = 0
        self.consumer_gone = 0  # its holder's session ended, or the dispatcher died, while it was held
        self.last_error = ""
        self.last_consumer = ""
        self.first_ms = now_ms
        self.last_ms = now_ms

    def as_dict(self) -> dict[str, object]:
        return {"cancelled": self.cancelled, "failed": self.failed, "lease_expired": self.lease_expired,
                "consumer_gone": self.consumer_gone, "last_error": self.last_error,
                "last_consumer": self.last_consumer, "first_ms": self.first_ms, "last_ms": self.last_ms}


class CauseLedger:
    """Delivery accounting by cause (see ``Causes``): a ``Causes`` for each message still
    here whose deliveries ended unfinished (``open``), and this step's finished ones
    (``done``: their dead letters carry them; the engine clears it after each drain);
    the queue's counts for stats, and its limits by cause, which dead-letter."""

    __slots__ = ("open", "done", "names", "failed", "lease_expiries", "consumers_gone",
                 "max_failures", "max_lease_expiries", "max_consumer_gone")

    def __init__(self, s: QueueSettings) -> None:
        self.open: dict[int, Causes] = {}
        self.done: dict[int, Causes] = {}
        self.names: dict[str, str] = {}  # consumer -> the name it gave at HELLO (the engine's, shared)
        self.failed = self.lease_expiries = self.consumers_gone = 0  # stats
        self.max_failures = self.max_lease_expiries = self.max_consumer_gone = 0
        self.configure(s)

    def configure(self, s: QueueSettings) -> None:
        self.max_failures = s.max_failures
        self.max_lease_expiries = s.max_lease_expiries
        self.max_consumer_gone = s.max_consumer_gone

    def limited(self) -> bool:
        """Does any cause have a limit (then exhausted messages are looked for)?"""
        return bool(self.max_failures or self.max_lease_expiries or self.max_consumer_gone)

    def note(self, seq: int, kind: str, consumer: str, now_ms: int, error: str = "") -> str:
        """Count why a delivery of ``seq`` ended unfinished; returns the dead-letter
        reason when that cause's limit is reached, else ""."""
        c = self.open.get(seq)
        if c is None:
            c = self.open[seq] = Causes(now_ms)
        limit = n = 0
        reason = ""
        if kind == R.CANCELLED:
            if error:
                c.failed += 1
                c.last_error = error
                self.failed += 1
                limit, n, reason = self.max_failures, c.failed, R.REASON_MAX_FAILURES
            else:
                c.cancelled += 1
        elif kind == R.LEASE_EXPIRED:
            c.lease_expired += 1
            self.lease_expiries += 1
            limit, n, reason = self.max_lease_expiries, c.lease_expired, R.REASON_MAX_LEASE_EXPIRIES
        else:
            c.consumer_gone += 1
            self.consumers_gone += 1
            limit, n, reason = self.max_consumer_gone, c.consumer_gone, R.REASON_MAX_CONSUMER_GONE
        c.last_consumer = self.names.get(consumer) or consumer
        if now_ms > c.last_ms:
            c.last_ms = now_ms
        return reason if limit and n >= limit else ""

    def finished(self, seq: int) -> None:
        """``seq`` left the queue for good: its causes go with its dead letter, if any."""
        c = self.open.pop(seq, None)
        if c is not None:
            self.done[seq] = c

    def restore(self, seq: int, counts: list, error: str, consumer: str) -> None:
        """Recovery: ``counts`` = [cancelled, failed, lease expired, consumer gone, first
        ms, last ms], from the message's events."""
        c = self.open[seq] = Causes(counts[4])
        c.cancelled, c.failed, c.lease_expired, c.consumer_gone, c.last_ms = counts[0], counts[1], counts[2], counts[3], counts[5]
        c.last_error, c.last_consumer = error, consumer
