"""Message groups in a queue: each group's messages go in order, one holder at a time
(Qpid's message groups; docs/protocol.md §11).

A group's messages that cannot go yet wait in its ``pending`` array (*parked*), so a
busy group never blocks the messages behind it (Qpid: groups never block each other). A
group that has pending messages and could go now has an entry in the queue's ``ready``
heap keyed by its oldest pending message's rank; stale entries are dropped where met.
Policies: ``sequenced`` -- a holder while it holds any of the group's messages (Qpid's
QIP); ``exclusive`` -- a holder for life; ``one-in-flight`` -- no holder, one message
out at a time. A group whose holder is full waits in the holder's ``waiting_groups``
until it settles something (``credit_opened``). A group with nothing left is forgotten.
"""

from __future__ import annotations

import heapq
from array import array
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zq.core.queue import Queue, Subscription


class Group:
    __slots__ = ("gid", "name", "pending", "phead", "inflight", "owner", "count", "held")

    def __init__(self, gid: int, name: str) -> None:
        self.gid = gid
        self.name = name
        self.pending = array("Q")
        self.phead = 0
        self.inflight = 0
        self.owner: Subscription | None = None
        self.count = 0  # messages of this group still in the queue (waiting or leased)
        self.held = 0  # the group's head, set aside by filters (0: none); the rest waits behind it

    def has_pending(self) -> bool:
        return self.phead < len(self.pending)


def policy(name: str) -> tuple[bool, bool, bool]:
    """(exclusive, owned, held while busy) of a group policy: ``owned`` -- a group has a
    holder, and only the holder takes its next messages, up to its credit: for life in
    ``exclusive``, while it holds any of them in ``sequenced`` (Qpid's QIP, policy 2)."""
    return name == "exclusive", name in ("exclusive", "sequenced"), name == "sequenced"


def push_ready(q: Queue, grp: Group) -> None:
    """The group can go: its head competes for dispatch by its rank."""
    heapq.heappush(q.ready, (q.key_of(grp.pending[grp.phead]), grp.gid))


def pop_head(q: Queue, grp: Group) -> None:
    grp.phead += 1
    after_pop(q, grp)


def can_go(q: Queue, grp: Group) -> bool:
    if grp.held:
        return False
    if q.delays.due and grp.phead < len(grp.pending) and grp.pending[grp.phead] in q.delays.due:
        return False  # parked: its head waits for its time, and the group behind it
    if q.owned:
        owner = grp.owner
        return owner is None or owner.used < owner.backlog
    return grp.inflight == 0


def park(q: Queue, grp: Group, seq: int) -> None:
    """Put a fifo message into its group's pending list (it is older than none there)."""
    was_empty = not grp.has_pending()
    grp.pending.append(seq)
    if was_empty:
        became_pending(q, grp)


def became_pending(q: Queue, grp: Group) -> None:
    if can_go(q, grp):
        push_ready(q, grp)
    elif q.owned and grp.owner is not None:
        grp.owner.waiting_groups.add(grp.gid)


def after_pop(q: Queue, grp: Group) -> None:
    if grp.phead >= len(grp.pending):
        grp.pending = array("Q")
        grp.phead = 0
    elif grp.phead > 64 and grp.phead * 2 > len(grp.pending):
        del grp.pending[: grp.phead]
        grp.phead = 0


def disown(q: Queue, grp: Group) -> None:
    """A group leaves its holder: an exclusive one whose filter refuses the group's
    next message, a sequenced one that holds none of it any more."""
    owner = grp.owner
    assert owner is not None and grp.inflight == 0
    owner.owned_groups.discard(grp.gid)
    owner.waiting_groups.discard(grp.gid)
    grp.owner = None


def settled(q: Queue, grp: Group) -> None:
    """One of ``grp``'s messages left its holder (settled, returned or expired)."""
    if grp.inflight == 0 and q.held_while_busy and grp.owner is not None:
        disown(q, grp)  # holds none of it now: the group's next message may go to anyone
    if grp.held:
        q.aside.gen += 1  # its set-aside head may be eligible now
    elif not q.exclusive and grp.inflight == 0 and grp.has_pending():
        push_ready(q, grp)


def maybe_forget(q: Queue, grp: Group) -> None:
    if grp.count == 0 and grp.owner is None and grp.inflight == 0 and not grp.has_pending():
        del q.groups[grp.gid]
        del q.gid_of[grp.name]
