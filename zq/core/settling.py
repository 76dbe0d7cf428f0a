"""Settling deliveries: a holder's answer (ack, cancel, expire) or a lease that ended
without one (expiry, the holder gone), and where the message goes next.

Settles are fenced: each names the delivery count it was delivered with (its *epoch*);
one whose delivery is no longer the live one is not applied (``fence``) and answers why
(``settle_result``: ``lost``, ``done``, ``dead`` or ``unknown``). A delivery that ended
unfinished comes back to its original place among the waiting ones (``put_back``), at
once or after the retry schedule, unless a limit dead-letters it (``max_deliveries``,
``max_cancels``, the limits by cause in ``CauseLedger``). Acks are a third of the
engine's per-message work: ``ack_many`` settles a batch inline where nothing else has to
be updated on the way out.
"""

from __future__ import annotations

import heapq
from bisect import insort
from collections import deque
from typing import TYPE_CHECKING

from zq.core import browse, delaying, grouping, leases, limits, removal
from zq.core import records as R
from zq.core.leases import C_ONE, C_SHIFT, D_MASK, G_SHIFT


if TYPE_CHECKING:
    from zq.core.queue import Queue, Subscription

class RecentlyDead:
    """Messages that left the queue unacknowledged after a delivery (dead-lettered,
    dropped, expired, replaced), recently: a late settle of one answers ``dead`` rather
    than ``done`` (``settle_result``). Bounded (``limits.DEAD_REMEMBERED`` per queue, while
    the dispatcher runs), the oldest forgotten first."""

    def __init__(self) -> None:
        self.seqs: set[int] = set()
        self.order: deque[int] = deque()

    def remember(self, seq: int) -> None:
        if seq in self.seqs:
            return
        self.seqs.add(seq)
        self.order.append(seq)
        if len(self.order) > limits.DEAD_REMEMBERED:
            self.seqs.discard(self.order.popleft())




def ack(q: Queue, sub: Subscription, seq: int, now_ms: int = 0) -> str | None:
    """Returns None when acknowledged, else the reason it was refused."""
    if q.browse:
        return browse.settle(q, sub, seq)
    lease = q.lease_of.get(seq)
    if lease is None or lease.sub is not sub:
        if lease is None and q.settings.allow_ack_unleased and removal.remove_available(q, seq):
            q.acked += 1
            q.note_event(R.ACKED, sub.consumer, seq, 0)
            return None
        return "not-leased"
    _, m = leases.release(q, seq)
    q.finish(seq, m >> G_SHIFT)
    q.acked += 1
    sub.acked += 1
    sub.busy_ms += now_ms - lease.started_ms if now_ms else 0
    q.note_event(R.ACKED, sub.consumer, seq, m & D_MASK)
    return None


def ack_many(q: Queue, sub: Subscription, seqs: list[int], now_ms: int = 0, epochs: list[int] | None = None,
             stale: list[int] | None = None) -> list[int]:
    """Acknowledge a batch; returns the seqs refused (see ``ack`` for the reasons).
    ``epochs`` (fenced acks): a seq leased to ``sub`` under another delivery count
    is not acked but added to ``stale`` (``fence``); checked in the same pass.

    Acks are a third of the engine's per-message work, so on a queue with no ranks,
    sizes or last-value keys (nothing else to update on the way out) a leased
    message takes ``release`` + ``finish`` + ``note_event`` inline, as a batch; a
    seq not leased by ``sub`` goes through ``ack`` (the refusal, or
    ``allow_ack_unleased``). Waiting groups of ``sub`` are offered its freed credit
    once, after the batch: ``ready`` is a heap, so the order of pushes is moot."""
    if q.browse or q.ordered or q.overflow.sizes is not None or q.last_values.key_of:
        if epochs:
            seqs, fenced_off = fence(q, sub, seqs, epochs)
            if stale is not None:
                stale.extend(fenced_off)
        return [seq for seq in seqs if ack(q, sub, seq, now_ms) is not None]
    lease_of, meta, groups = q.lease_of, q.meta, q.groups
    fenced = bool(epochs)
    events = q.events_out.get((R.ACKED, sub.consumer, ""))
    if events is None:
        events = q.events_out[(R.ACKED, sub.consumer, "")] = []
    refused: list[int] = []
    done = busy = 0
    # What a finished message leaves elsewhere (each usually empty: one test per message).
    causes_open, reclaimed, deadlines = q.ledger.open, q.reclaiming.given, q.deadlines
    with_deadline, overdue = deadlines.due, deadlines.overdue
    for i, seq in enumerate(seqs):
        lease = lease_of.get(seq)
        if lease is None or lease.sub is not sub:
            if ack(q, sub, seq, now_ms) is not None:
                refused.append(seq)
            continue
        m = meta.pop(seq)
        if fenced and m & D_MASK != epochs[i]:  # type: ignore[index]
            meta[seq] = m  # leased to us again since: that delivery is not this one
            if stale is not None:
                stale.append(seq)
            continue
        del lease_of[seq]
        lease.live -= 1
        if causes_open:
            causes_open.pop(seq, None)
        if reclaimed:
            reclaimed.pop(seq, None)
        if with_deadline or overdue:
            deadlines.finished(seq)
        busy += now_ms - lease.started_ms
        events.append((seq, m & D_MASK))
        done += 1
        gid = m >> G_SHIFT
        if gid:  # release() then finish() of a grouped message
            grp = groups[gid]
            grp.inflight -= 1
            grouping.settled(q, grp)
            grp.count -= 1
            grouping.maybe_forget(q, grp)
    if done:
        sub.used -= done
        if sub.pull:
            sub.backlog -= done  # settling a claimed message opens no credit
        elif sub.waiting_groups:
            q.credit_opened(sub)
        q.acked += done
        sub.acked += done
        if now_ms:
            sub.busy_ms += busy
        q.dirty = True
    elif not events:
        del q.events_out[(R.ACKED, sub.consumer, "")]  # nothing acked: no empty event
    return refused


def fence(q: Queue, sub: Subscription, seqs: list[int], epochs: list[int]) -> tuple[list[int], list[int]]:
    """Fenced settles: split ``seqs`` into those to apply and those whose delivery
    (``epochs``: the delivery count each was delivered with) is no longer the live
    one: leased to ``sub`` again since, under a newer count. A seq not leased to
    ``sub`` at all is left to the settle itself, which refuses it."""
    lease_of, meta = q.lease_of, q.meta
    live: list[int] = []
    stale: list[int] = []
    for seq, epoch in zip(seqs, epochs):
        lease = lease_of.get(seq)
        if lease is not None and lease.sub is sub and meta[seq] & D_MASK != epoch:
            stale.append(seq)
        else:
            live.append(seq)
    return live, stale


def settle_result(q: Queue, seq: int, next_seq: int) -> str:
    """Why a settle of ``seq`` was not applied (cheap: a hostile batch of bookmarks
    costs a dict lookup each): ``lost`` -- the message is still here and has been
    delivered (another delivery is live, or it waits to go again); ``done`` -- it has
    no live delivery count here: finished (acked, expired, dead-lettered), or never
    delivered by this queue; ``dead`` -- it left this queue unacknowledged after
    being delivered (dead-lettered, or dropped, expired or replaced), recently
    (``limits.DEAD_REMEMBERED`` per queue, while the dispatcher runs);
    ``unknown`` -- no such bookmark was ever given out."""
    if seq in q.meta:
        return "lost"
    if seq in q.recently_dead.seqs:
        return "dead"
    if 0 < seq < next_seq:
        return "done"
    return "unknown"


def cancel(q: Queue, sub: Subscription, seq: int, now_ms: int = -1, delay_ms: int = -1, error: str = "") -> str | None:
    """Cancel (nack) a delivery: the message goes again after the queue's retry
    schedule, or after ``delay_ms`` when the cancel names one (0: at once). With
    ``error`` the delivery *failed*: counted as such, and kept as the last error."""
    if q.browse:
        return browse.settle(q, sub, seq)
    lease = q.lease_of.get(seq)
    if lease is None or lease.sub is not sub:
        return "not-leased"
    _, m = leases.release(q, seq)
    q.cancelled += 1
    if q.at_most_once:
        q.finish(seq, m >> G_SHIFT)
        q.note_event(R.CANCELLED, sub.consumer, seq, m & D_MASK, error)
        return None
    m += C_ONE
    q.meta[seq] = m
    q.note_event(R.CANCELLED, sub.consumer, seq, m & D_MASK, error)  # the reason of a failure: its error
    over = q.note_cause(seq, R.CANCELLED, sub.consumer, now_ms, error)
    if error:
        q.last_holder[seq] = sub.consumer  # failed here: anyone else first (popped if it leaves)
    max_cancels = q.settings.max_cancels
    if max_cancels and (m >> C_SHIFT) & D_MASK >= max_cancels:
        expire_leased(q, seq, m, R.REASON_MAX_CANCELS)
    elif over:
        expire_leased(q, seq, m, over)
    else:
        come_back(q, seq, m, now_ms, delay_ms)
    return None


def expire_request(q: Queue, sub: Subscription, seq: int) -> str | None:
    if q.browse:
        return browse.settle(q, sub, seq)  # browsers do not remove messages
    lease = q.lease_of.get(seq)
    if lease is None or lease.sub is not sub:
        return "not-leased"
    _, m = leases.release(q, seq)
    expire_leased(q, seq, m, R.REASON_REQUESTED)  # at-most-once too: the holder asks for a dead letter
    return None


def end_lease_of(q: Queue, seq: int, kind: str, now_ms: int = -1) -> None:
    """A lease ends without an answer (expiry, unsubscribe, consumer gone). After a
    lease expiry the retry schedule applies; a consumer that went away (RETURNED)
    says nothing about the message, which goes again at once."""
    lease, m = leases.release(q, seq)
    consumer = lease.sub.consumer
    q.note_event(kind, consumer, seq, m & D_MASK)
    if q.at_most_once:
        q.finish(seq, m >> G_SHIFT)
        return
    over = q.note_cause(seq, kind, consumer, max(now_ms, 0))
    if over:
        expire_leased(q, seq, m, over)
        return
    if kind == R.LEASE_EXPIRED:
        q.last_holder[seq] = consumer  # stuck there, maybe: anyone else first
    come_back(q, seq, m, now_ms, -1 if kind == R.LEASE_EXPIRED else 0)


def come_back(q: Queue, seq: int, m: int, now_ms: int = -1, delay_ms: int = -1) -> None:
    """A delivery ended unfinished: expire if out of deliveries, else wait again:
    at once, or (with ``now_ms`` >= 0) after ``delay_ms`` or the queue's retry schedule."""
    max_deliveries = q.settings.max_deliveries
    if max_deliveries and q.counted_deliveries(seq, m) >= max_deliveries:
        expire_leased(q, seq, m, R.REASON_MAX_DELIVERIES)
        return
    if now_ms >= 0:
        reason = R.DELAY_REQUESTED
        if delay_ms < 0:
            delay_ms = delaying.retry_delay_ms(q, seq, m & D_MASK) if q.backoff else 0
            reason = R.DELAY_BACKOFF
        if delay_ms > 0:
            put_back(q, seq, m, now_ms + delay_ms, reason)
            return
    put_back(q, seq, m)


def put_back(q: Queue, seq: int, m: int, due_ms: int = 0, reason: str = "") -> None:
    """Return a message to its original place among the waiting ones (not to go
    before ``due_ms``, when given)."""
    if seq <= q.expired_watermark:
        expire_leased(q, seq, m, R.REASON_EXPIRED)
        return
    if q.deadlines.overdue and q.deadlines.expire_overdue(seq):  # its deadline passed while it was out
        expire_leased(q, seq, m, R.REASON_TTL)
        return
    if q.last_values.key_of and q.last_values.superseded(seq):  # a newer value came while it was out
        q.last_values.replaced += 1
        expire_leased(q, seq, m, R.REASON_REPLACED)
        q.expired -= 1  # counted as replaced, not expired
        return
    q.depth += 1
    q.dirty = True
    gid = m >> G_SHIFT
    if due_ms > 0:
        delaying.mark(q, seq, gid, due_ms, reason)
        if reason == R.DELAY_BACKOFF:
            q.retries_delayed += 1
        if not gid:
            q.sleeping.add(q.ranks[seq] if q.ordered else seq)  # ranks keeps it: outside the heap
            return
    if not gid:
        if q.ordered:
            heapq.heappush(q.returned, q.ranks.pop(seq))
            if q.heap_oldest is not None and seq < q.heap_oldest:
                q.heap_oldest = seq
        else:
            heapq.heappush(q.returned, seq)
        return
    grp = q.groups[gid]
    if grp.held and grp.held > seq:
        held, grp.held = grp.held, 0
        q.aside.gone.add(q.key_of(held))
        insort(grp.pending, held, lo=grp.phead)
        if grp.pending[grp.phead] == held:
            grouping.became_pending(q, grp)
    old_head = grp.pending[grp.phead] if grp.has_pending() else None
    insort(grp.pending, seq, lo=grp.phead)
    if old_head is None or seq < old_head:
        grouping.became_pending(q, grp)


def expire_leased(q: Queue, seq: int, m: int, reason: str) -> None:
    gid = m >> G_SHIFT
    name = q.groups[gid].name if gid else None
    q.finish(seq, gid)
    q.expired_out.append((seq, reason, m & D_MASK, name))
    q.expired += 1
