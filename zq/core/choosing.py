"""Who gets the next message: a queue's fairness among its subscriptions with credit.

``proportional`` (AMPS's default) picks the subscription with the largest unused share
of its backlog, ``round-robin`` takes turns, ``fast`` the first with credit. A group's
holder takes its group's messages whatever the fairness. ``choose_avoiding`` passes over
the consumer whose delivery of the message expired or failed while anyone else has
credit; ``choose_for`` is the same choice among subscriptions whose filter matches,
counting each filter evaluation against the dispatch's budget (``Queue.matches``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zq.core import grouping

if TYPE_CHECKING:
    from zq.core.grouping import Group
    from zq.core.queue import Queue, Subscription


def choose_next(q: Queue, grp: Group | None, seq: int) -> Subscription | None:
    """Who takes ``seq`` (of group ``grp``) when it comes back or its group's turn comes:
    anyone but the consumer its last delivery expired or failed with, while another has
    credit; among those whose filter takes it, on a queue with filtered subscriptions."""
    avoid = q.last_holder.get(seq) if q.last_holder else None
    if q.filtered:
        return choose_for(q, grp, seq, avoid)
    return choose(q, grp) if avoid is None else choose_avoiding(q, grp, avoid)


def choose(q: Queue, grp: Group | None) -> Subscription | None:
    """Pick the subscription for the next message by the queue's fairness."""
    if grp is not None and q.owned and grp.owner is not None:
        return grp.owner  # grouping.can_go checked its credit
    subs = q.subs
    if q.fairness == "proportional":
        best = None
        best_free = 0.0
        for s in subs:
            free = s.backlog - s.used
            if free > 0:
                frac = free / s.backlog
                if frac > best_free:
                    best, best_free = s, frac
        return best
    if q.fairness == "fast":
        for s in subs:
            if s.used < s.backlog:
                return s
        return None
    count = len(subs)
    start = q.rr_next % count if count else 0
    for i in range(count):
        s = subs[(start + i) % count]
        if s.used < s.backlog:
            q.rr_next = (start + i + 1) % count
            return s
    return None


def choose_avoiding(q: Queue, grp: Group | None, avoid: str) -> Subscription | None:
    """``choose``, passing over consumer ``avoid`` (whose delivery of the message
    expired or failed) while anyone else has credit: only then does it go back to them."""
    if grp is not None and q.owned and grp.owner is not None:
        return grp.owner
    subs = q.subs
    count = len(subs)
    rr = q.fairness == "round-robin"
    proportional = q.fairness == "proportional"
    start = q.rr_next % count if count and rr else 0
    best = None
    best_free = 0.0
    for i in range(count):
        s = subs[(start + i) % count]
        free = s.backlog - s.used
        if free <= 0 or s.consumer == avoid:
            continue
        if not proportional:
            if rr:
                q.rr_next = (start + i + 1) % count
            return s
        frac = free / s.backlog
        if frac > best_free:
            best, best_free = s, frac
    return best if best is not None else choose(q, grp)


def any_credit(q: Queue) -> bool:
    return any(s.used < s.backlog for s in q.subs)


def choose_for(q: Queue, grp: Group | None, seq: int, avoid: str | None = None) -> Subscription | None:
    """``choose`` among the subscriptions whose filter matches ``seq`` (consumer
    ``avoid`` last: see ``choose_avoiding``)."""
    if grp is not None and q.owned and grp.owner is not None:
        owner = grp.owner
        if owner.match is None:
            return owner
        q.matches += 1
        if owner.match(seq):
            return owner
        if grp.inflight:
            return None
        grouping.disown(q, grp)  # its owner refuses the group's next message and holds none
    subs = q.subs
    order = [s for s in subs if s.used < s.backlog]
    if len(order) > 1:
        if q.fairness == "proportional":
            order.sort(key=lambda s: (s.used - s.backlog) / s.backlog)
        elif q.fairness == "round-robin":
            count = len(subs)
            start = q.rr_next % count
            order = [subs[(start + i) % count] for i in range(count) if subs[(start + i) % count].used < subs[(start + i) % count].backlog]
    if avoid is not None:
        order = [s for s in order if s.consumer != avoid] + [s for s in order if s.consumer == avoid]
    for s in order:
        if s.match is not None:
            q.matches += 1
        if s.match is None or s.match(seq):
            if q.fairness == "round-robin":
                q.rr_next = (subs.index(s) + 1) % len(subs)
            return s
    return None
