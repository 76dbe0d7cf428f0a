"""A queue's size limits (``max_depth``, ``max_bytes``) and last-value replacement: what
makes a message leave, or not enter, because of the others.

At a limit, ``overflow`` decides (docs/protocol.md): ``reject`` refuses the publish,
``ring`` drops the oldest available messages (``make_room``), ``flow-control`` takes it
and withholds confirmations until the queue is back under ``resume_percent``
(``blocked``; the engine ends the breach). Sizes are kept per message only when
``max_bytes`` is set. A last-value queue (``lvq_key``) keeps the newest message of each
key: an older available one leaves as ``replaced`` (a leased one stays with its holder,
and does not come back when its delivery ends).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zq.core import inventory, removal
from zq.core import records as R
from zq.core.expr import compile_value

if TYPE_CHECKING:
    from zq.core.queue import Queue
    from zq.core.settings import QueueSettings


class Overflow:
    """``max_depth`` / ``max_bytes`` of one queue and its breaches."""

    def __init__(self, q: Queue, s: QueueSettings) -> None:
        self.q = q
        self.limited = bool(s.max_depth or s.max_bytes)
        self.sizes: dict[int, int] | None = {} if s.max_bytes else None
        self.bytes = 0
        self.blocked = False  # over a limit: the breach is on (flow-control: confirmations withheld)
        self.breaches = self.rejected = self.dropped = 0

    def configure(self, s: QueueSettings) -> None:
        self.limited = bool(s.max_depth or s.max_bytes)

    def would_overflow(self, count: int, size: int) -> bool:
        q = self.q
        s = q.settings
        return bool(s.max_depth and q.held() + count > s.max_depth
                    or s.max_bytes and self.bytes + size > s.max_bytes)

    def over(self, percent: int = 100) -> bool:
        q = self.q
        s = q.settings
        return bool(s.max_depth and q.held() * 100 > s.max_depth * percent
                    or s.max_bytes and self.bytes * 100 > s.max_bytes * percent)

    def make_room(self) -> None:
        """overflow = "ring": drop the oldest available messages until under the limits."""
        q = self.q
        while self.over() and q.depth:
            removal.drop_removed_front(q)
            seq = inventory.oldest_waiting(q)
            if seq is None or not removal.remove_available(q, seq):
                return
            self.dropped += 1
            q.expired += 1
            q.expired_out.append((seq, R.REASON_OVERFLOW, q.deliveries_of(seq), q.group_name_of(seq)))

    def forget(self, seq: int) -> None:
        """``seq`` no longer counts against ``max_bytes``."""
        if self.sizes is not None:
            self.bytes -= self.sizes.pop(seq, 0)


class LastValues:
    """A last-value queue's newest message of each key (``lvq_key``)."""

    def __init__(self, q: Queue, s: QueueSettings) -> None:
        self.q = q
        self.fn = compile_value(s.lvq_key).fn if s.lvq_key else None
        self.latest: dict[object, int] = {}  # key -> newest message of that key
        self.key_of: dict[int, object] = {}
        self.replaced = 0

    def admit(self, seq: int, key: object) -> None:
        """``seq`` of ``key`` entered: an older available one leaves (a leased one stays
        with its holder, and does not come back)."""
        if key is None or type(key) not in (str, int, float, bool):
            return
        q = self.q
        old = self.latest.get(key)
        self.latest[key] = seq
        self.key_of[seq] = key
        if old is not None and old not in q.lease_of and removal.remove_available(q, old):
            self.replaced += 1
            q.expired_out.append((old, R.REASON_REPLACED, q.deliveries_of(old), q.group_name_of(old)))

    def superseded(self, seq: int) -> bool:
        """Did a newer value of ``seq``'s key come while ``seq`` was out?"""
        key = self.key_of.get(seq)
        return key is not None and self.latest.get(key) != seq

    def finished(self, seq: int) -> None:
        key = self.key_of.pop(seq, None)
        if key is not None and self.latest.get(key) == seq:
            del self.latest[key]
