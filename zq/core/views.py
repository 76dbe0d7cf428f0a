"""Views: what operators and clients read of the queues (``zq stats``, ``zq top``,
PEEK, QUERY), computed on demand and changing nothing.

A view must cost what its answer holds, not what the dispatcher holds: ``stats``
with a limit ranks the queues by what they hold and reports only the busiest, and
``peek`` and ``query`` read at most ``limits.VIEW_SCAN_MAX`` waiting messages.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Any

from zq.core import expr, inventory, limits
from zq.core.errors import NotSupportedError
from zq.core.query import Query
from zq.core.settings import QueueSettings
from zq.core.timeindex import ACK_LATENCY_BUCKETS_MS

if TYPE_CHECKING:
    from collections.abc import Callable

    from zq.core.admission import Admission
    from zq.core.host import Host
    from zq.core.queue import Queue
    from zq.core.timeindex import TimeIndex


def held_count(q: Queue) -> int:
    return q.depth + len(q.lease_of)


class Views:
    """The engine's read-only answers about its queues."""

    def __init__(self, host: Host, admission: Admission, times: TimeIndex) -> None:
        self.host = host
        self.admission = admission  # (its publish and duplicate counts)
        self.times = times

    def stats(self, names: list[str] | None = None, limit: int = 0,
              sees: Callable[[str], bool] | None = None) -> dict[str, Any]:
        """Every queue's figures, or only ``names`` (those that exist) and those ``sees``
        allows; with ``limit``, at most that many: the ones holding the most messages
        (waiting and leased; ties in the order the queues were made), so that an answer
        costs the same with 10,000 queues as with ``limit`` (``queues_total`` counts all)."""
        if names is not None:
            chosen = [q for q in (self.host.queues.get(n) for n in dict.fromkeys(names)) if q is not None]
        else:
            chosen = list(self.host.queues.values())
        if sees is not None:
            chosen = [q for q in chosen if sees(q.name)]
        total = len(chosen)
        if limit and total > limit:
            busiest = {q.name for q in heapq.nlargest(limit, chosen, key=held_count)}
            chosen = [q for q in chosen if q.name in busiest]
        queues = {q.name: self.figures(q) for q in chosen}
        return {"queues": queues, "queues_total": total, "published": self.admission.published,
                "duplicates": self.admission.duplicates, "next_seq": self.host.next_seq}

    def figures(self, q: Queue) -> dict[str, Any]:
        """One queue's figures, as ``zq stats`` and ``zq top`` show them."""
        out: dict[str, Any] = {
            "depth": q.depth,
            "leased": len(q.lease_of),
            "published": q.published,
            "delivered": q.delivered,
            "acked": q.acked,
            "cancelled": q.cancelled,
            "expired": q.expired,
            "dead_lettered": q.dead_lettered,
            "redelivered": q.redelivered,
            "lost": q.lost_settles,
            "transactions": q.transactions,
            "transactions_refused": q.transactions_refused,
            "delayed": len(q.delays.due) + len(q.target.due),
            "retries_delayed": q.retries_delayed,
            "renewed": q.renewed,
            "failed": q.ledger.failed,
            "lease_expiries": q.ledger.lease_expiries,
            "consumers_gone": q.ledger.consumers_gone,
            "revoked": q.reclaiming.revoked,
            "reclaimed": q.reclaiming.reclaimed,
            "groups": len(q.groups),
            "overflow": {"policy": q.settings.overflow, "max_depth": q.settings.max_depth,
                         "max_bytes": q.settings.max_bytes, "bytes": q.overflow.bytes, "over": q.overflow.blocked,
                         "breaches": q.overflow.breaches, "rejected": q.overflow.rejected, "dropped": q.overflow.dropped},
            "replaced": q.last_values.replaced,
            "poisoned": q.poisoned,  # set aside: content the queue could not evaluate (R.REASON_POISON)
            "ttl_expired": q.deadlines.expired,  # still waiting at their publish's deadline (R.REASON_TTL)
            "with_deadline": len(q.deadlines.due),
            "inactive": q.target.inactive,
            "kind": queue_kind(q.settings),
            "barriers": {"waiting": len(q.barrier.waiting), "released": q.barrier.released},
            "semantics": q.settings.semantics,
            "oldest_ms": self.oldest_waiting_ms(q),
            "oldest_bookmark": inventory.oldest_waiting(q) if q.depth else None,  # what zq top explains
            "ack_latency": {"buckets_ms": list(ACK_LATENCY_BUCKETS_MS), "counts": list(q.ack_latency),
                            "sum_ms": q.ack_latency_sum_ms, "ms": dict(q.ack_latency_ms)},
            "consumers": [
                {"sub": s.sub_id, "consumer": s.consumer, "used": s.used, "backlog": s.backlog + s.held_back,
                 "acked": s.acked, "busy_ms": s.busy_ms, "reclaimable": s.reclaimable,
                 "given_back": s.given_back}
                for s in q.subs
            ],
        }
        if q.grouped:
            out["group_summary"] = inventory.group_summary(q)
        if q.fair_share is not None and q.settings.tenant_header:
            out["tenants"] = q.fair_share.summary()
        return out

    def oldest_waiting_ms(self, q: Queue) -> int | None:
        """Age of the oldest waiting message (ms), or None when nothing waits."""
        if not q.depth:
            return None
        oldest = inventory.oldest_waiting(q)
        now = self.host.now_ms
        return None if oldest is None else now - self.times.publish_time_ms(oldest, now)

    def peek(self, queue: str, limit: int, filter: str | None = None) -> list[tuple[int, int]]:
        """Waiting messages in delivery order as (bookmark, deliveries), without leasing.

        With ``filter``, only matching ones; at most ``limits.VIEW_SCAN_MAX`` are read.
        """
        q = self.host.queue(queue)
        match = self.host.matcher(expr.compile_filter(filter, self.host.expr_limits)) if filter else None
        out: list[tuple[int, int]] = []
        for i, seq in enumerate(inventory.waiting(q)):
            if len(out) >= limit or i >= limits.VIEW_SCAN_MAX:
                break
            if match is None or match(seq):
                out.append((seq, q.deliveries_of(seq)))
        return out

    def query(self, queue: str, group_by: list[str], aggregates: list[str], filter: str | None = None) -> dict[str, Any]:
        """Aggregates over the available messages of ``queue`` (see ``zq.core.query``)."""
        q = self.host.queue(queue)
        if self.host.content is None:
            raise NotSupportedError("queries need an engine with a content reader (a journal)")
        qry = Query(group_by, aggregates, filter, self.host.expr_limits)
        truncated = False
        for i, seq in enumerate(inventory.waiting(q)):
            if i >= limits.VIEW_SCAN_MAX:
                truncated = True
                break
            m = self.host.message(seq)
            if m is not None:
                qry.add(m)
        return {"rows": qry.rows(), "scanned": qry.scanned, "truncated": truncated}


def queue_kind(s: QueueSettings) -> str:
    """A short label of a queue's kind for operators (``zq stats``): "" for a plain FIFO."""
    parts = []
    if s.tenant_header:
        parts.append("tenants")
    if s.priority:
        parts.append("priority/aging" if s.priority_aging else "priority")
    if s.sort_key:
        parts.append("sorted")
    if s.target_queue_depth:
        parts.append(f"tqd={s.target_queue_depth}")
    if s.browse_only:
        parts.append("browse")
    if s.lvq_key:
        parts.append("lvq")
    if s.barrier:
        parts.append("barrier")
    if s.max_depth or s.max_bytes:
        parts.append(s.overflow)
    return ",".join(parts)
