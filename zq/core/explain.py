"""Why a message is where it is (``zq explain``): read-only, from the engine's state.

An operator at 3 a.m. asks about one message: is it out with a worker (whose, until
when), waiting (and what holds it: its group's holder, a barrier, filters, no consumer
with credit, older messages), or gone from the queue? This module answers from the
queue's structures without changing them, and cheaply: a dict lookup or a bisect per
place the message could be, never a walk over every group (a queue may have millions).
The dispatcher adds the message's delivery history from the journal's events.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import TYPE_CHECKING, Any

from zq.core import delaying
from zq.core.ordering import SEQ_MASK

if TYPE_CHECKING:
    from zq.core.engine import Engine
    from zq.core.queue import Queue

RETURNED_SCAN_MAX = 1_000_000  # returned messages looked through for one explain (a heap has no index)


def duration_text(ms: float) -> str:
    """A duration as a person reads it, rounded down to two units at most: ``850ms``,
    ``12.5s``, ``59m 54s``, ``3h 2m``, ``2d 4h`` (a negative one reads as ``0ms``). The
    one formatter of ``zq explain``, ``zq peek`` and ``zq stats``."""
    ms = max(0, int(ms))
    if ms < 1000:
        return f"{ms}ms"
    if ms < 60_000:
        whole, tenth = divmod(ms // 100, 10)
        return f"{whole}.{tenth}s" if tenth else f"{whole}s"
    if ms < 3_600_000:
        big, unit, small, sub = ms // 60_000, "m", ms % 60_000 // 1000, "s"
    elif ms < 86_400_000:
        big, unit, small, sub = ms // 3_600_000, "h", ms % 3_600_000 // 60_000, "m"
    else:
        big, unit, small, sub = ms // 86_400_000, "d", ms % 86_400_000 // 3_600_000, "h"
    return f"{big}{unit} {small}{sub}" if small else f"{big}{unit}"


def explain(engine: Engine, queue: str, seq: int, now_ms: int, topic: str | None,
            headers: dict[str, str] | None) -> dict[str, Any]:
    """Where message ``seq`` of ``queue`` is, and why. ``topic`` and ``headers``: the
    message's, when the journal holds it (None: no message has this bookmark)."""
    q: Queue = engine.queue(queue)  # type: ignore[attr-defined]
    out: dict[str, Any] = {"queue": queue, "bookmark": seq}
    out["deliveries"], out["cancels"] = q.deliveries_of(seq), q.cancels_of(seq)
    causes = q.causes_of(seq)
    if causes is not None:  # why earlier deliveries ended unfinished
        out["causes"] = causes.as_dict()
    reclaimed = q.reclaiming.given.get(seq, 0)
    if reclaimed:  # given back unstarted: not counted against max_deliveries
        out["reclaimed"] = reclaimed
    group = group_of(q, seq, headers)
    if group is not None:
        out["group"] = group
    fs = q.fair_share
    tenant = fs.tenant_of.get(seq) if fs is not None else None
    if fs is not None and tenant is not None:
        out["tenant"] = {"name": tenant, "weight": fs.weight(tenant), "held": fs.held.get(tenant, 0)}
    deadline = q.deadlines.due.get(seq)
    if deadline is not None:  # its publish's ttl: waiting then, it expires (reason ttl)
        out["expires_at_ms"] = deadline
    lease = q.lease_of.get(seq)
    if lease is not None:
        sub = lease.sub
        out["state"] = "leased"
        out["leased_to"] = {"consumer": sub.consumer, "name": engine.consumer_names.get(sub.consumer, ""),
                            "sub": sub.sub_id}
        out["lease_ends_in_ms"] = max(0, lease.deadline_ms - now_ms)
        out["why"] = [f"delivery {out['deliveries']} is out with {out['leased_to']['name'] or sub.consumer} "
                      f"until its lease ends in {duration_text(out['lease_ends_in_ms'])} (or it is acked, cancelled or expired)"]
        if seq in q.deadlines.overdue:
            out["why"].append("its publish's deadline (ttl) has passed: if this delivery ends unacked, it expires "
                              "(reason ttl) instead of going again")
        if seq in sub.revoking:
            out["why"].append("asked back for an idle consumer (reclaiming): it comes back if its holder has not "
                              "started it")
        max_age = q.settings.max_lease_age_ms
        if max_age:
            out["renews_until_ms"] = lease.started_ms + max_age
            out["why"].append(f"the lease renews while its holder stays connected, for at most "
                              f"{duration_text(lease.started_ms + max_age - now_ms)} more (max_lease_age)")
        return out
    place = waiting_place(q, seq, group)
    if place is None:
        out["state"] = "not-in-queue"
        if topic is None:
            out["why"] = ["no message has this bookmark in the journal (an event's bookmark, trimmed by retention, "
                          "or never published)"]
        elif not q.covers(topic) or seq < q.settings.start_seq:
            out["why"] = [f"not a message of this queue (its topic {topic!r} is not one of the queue's, or it was "
                          "published before the queue existed)"]
        elif q.target.inactive:
            out["why"] = ["settled (acked, expired or dead-lettered: see its history), or waiting in the journal-only "
                          "part of this TargetQueueDepth queue, read back as the queue drains"]
        else:
            out["why"] = ["settled: acked, expired or dead-lettered (see its history)"]
        return out
    out["state"] = "waiting"
    out["place"] = place
    due = delaying.due_of(q, seq)
    if due is not None:
        out["not_before_ms"] = due
        out["due_in_ms"] = max(0, due - now_ms)
    out["why"] = waiting_reasons(engine, q, seq, group, place, now_ms)
    if deadline is not None:
        out["why"].append(f"expires (reason ttl) if still waiting in {duration_text(max(0, deadline - now_ms))}: "
                          "its publish's deadline")
    return out


def group_of(q: Queue, seq: int, headers: dict[str, str] | None) -> str | None:
    """The message's group: the engine's (delivered once), else its header's."""
    name = q.group_name_of(seq)
    if name is not None:
        return name
    header = q.settings.group_header
    if headers is not None and header and q.grouped:
        return headers.get(header)
    return None


def waiting_place(q: Queue, seq: int, group: str | None) -> str | None:
    """Which waiting place holds ``seq`` (see zq.core.queue), or None. In an ordered
    queue the places hold ranks (``q.ranks``), and the fifo stays empty."""
    if seq in q.removed:
        return None
    if q.delays.due and seq in q.delays.due and seq not in q.lease_of:
        # Waiting for its time, wherever it sits: set aside asleep, parked at its group's
        # head, or still in the fifo where recovery put it (it was "fifo" after a restart).
        return "delayed"
    if q.sleeping and (q.ranks.get(seq, -1) if q.ordered else seq) in q.sleeping:
        return "delayed"
    if q.ordered:
        for i, key in enumerate(q.returned):
            if i >= RETURNED_SCAN_MAX:
                break
            if key & SEQ_MASK == seq:
                return "returned"
    else:
        i = bisect_left(q.fifo, seq, lo=q.head)
        if i < len(q.fifo) and q.fifo[i] == seq:
            return "fifo"
        if seq in q.returned[:RETURNED_SCAN_MAX]:
            return "returned"
    key = q.ranks.get(seq, -1) if q.ordered else seq
    if q.aside.index_of(key) >= 0:
        return "set-aside"
    if group is not None:
        gid = q.gid_of.get(group)
        if gid is not None:
            g = q.groups[gid]
            if seq in g.pending[g.phead:]:
                return "group"
    return None


def waiting_reasons(engine: Engine, q: Queue, seq: int, group: str | None, place: str,
                    now_ms: int = 0) -> list[str]:
    why: list[str] = []
    due = delaying.due_of(q, seq)
    if due is not None:
        what = "its retry" if q.deliveries_of(seq) else "the time it was published for"
        why.append(f"waits for {what}: due in {duration_text(due - now_ms)}")
    if q.barrier.waiting and q.barrier.waiting[0] < seq:
        why.append(f"behind barrier message {q.barrier.waiting[0]}: nothing later goes until every earlier message is acked")
    if place == "set-aside":
        why.append("set aside: every subscription with credit has a filter it does not match")
    if group is not None and group in q.gid_of:
        g = q.groups[q.gid_of[group]]
        holder = g.owner
        who = (engine.consumer_names.get(holder.consumer, "") or holder.consumer) if holder is not None else None
        if place == "group" and g.has_pending() and g.pending[g.phead] != seq:
            ahead = len(g.pending) - g.phead
            why.append(f"behind older messages of its group {group!r} ({ahead} of them wait in order)")
            head_due = delaying.due_of(q, g.pending[g.phead])
            if head_due is not None:
                why.append(f"its group {group!r} is parked: its oldest message {g.pending[g.phead]} waits for its "
                           f"time (in {duration_text(head_due - now_ms)}); other groups go on")
        if g.inflight and q.held_while_busy:
            why.append(f"its group {group!r} is held by {who} with {g.inflight} in flight (sequenced: no one else "
                       "takes the group until its holder holds none of it)")
        elif holder is not None and q.exclusive:
            why.append(f"its group {group!r} belongs to {who} (exclusive), which takes it as its credit allows")
    subs = q.subs
    if not subs:
        why.append("no consumer is subscribed to the queue")
    elif not any(s.used < s.backlog for s in subs):
        why.append(f"no consumer has credit: all {len(subs)} subscriptions hold their whole backlog "
                   f"({sum(s.used for s in subs)} unsettled)")
    if place == "fifo":
        ahead = bisect_left(q.fifo, seq, lo=q.head) - q.head
        if ahead:
            why.append(f"{ahead} messages published before it wait ahead of it")
    fs = q.fair_share
    if place == "returned" and fs is not None:
        heap = q.returned[:RETURNED_SCAN_MAX]
        key = next((k for k in heap if k & SEQ_MASK == seq), None)
        ahead = sum(1 for k in heap if key is not None and k < key)
        tenant = fs.tenant_of.get(seq)
        whose = (f"; its tenant {tenant[:80] or '(none)'!r} has weight {fs.weight(tenant)} and "
                 f"{fs.held.get(tenant, 0)} in the queue" if tenant is not None else "")
        if ahead:
            goes = "message goes" if ahead == 1 else "messages go"
            why.append(f"{ahead} {goes} before it by the fair share between tenants"
                       f"{' and priority' if q.priority_fn is not None else ''}{whose}")
    if not why:
        why.append("next in line: it goes with the next dispatch")
    return why
