"""A message entering a queue: what its content decides, and where it waits.

An ordered queue (priority, sort key, fair share) ranks each entering message once
(``level_of``: a fair queue moves its tenant's tag on), and a last-value queue reads its
key; ``judge`` reads both before anything moves. A message whose content cannot be
evaluated (``expr.Unevaluable``, or anything the ordering raises on it) never enters: it
is set aside as *poison* (``poison``) and fails alone, dead-lettered with its error, live
and at recovery alike (one body must never stop a dispatcher). A FIFO queue appends to
its fifo (``enqueue_run``: a batch of ungrouped messages in one extend); an ordered one
pushes an ungrouped message into the returned heap by rank, and parks a grouped one in
its group in publish order, its group's head competing by rank.
"""

from __future__ import annotations

import heapq
from array import array
from typing import TYPE_CHECKING

from zq.core import grouping
from zq.core import records as R
from zq.core.expr import Unevaluable, compile_value
from zq.core.fairshare import FairShare
from zq.core.ordering import level_function, priority_level, sort_level

if TYPE_CHECKING:
    from collections.abc import Callable

    from zq.core.queue import Queue
    from zq.core.settings import QueueSettings

    LevelFn = Callable[[dict[str, str], bytes, str], int]
    ValueFn = Callable[[dict[str, str], bytes, str], object]


def ranking(s: QueueSettings) -> tuple[LevelFn | None, ValueFn | None, FairShare | None]:
    """How a queue ranks what enters: (its level function, its raw priority expression,
    its fair share). A priority or sort key gives a level per message (zq.core.ordering);
    a fair queue (zq.core.fairshare) ranks by a tag that moves with each message, reading
    its priority expression raw and ageing it there. All None: a FIFO queue."""
    priority_fn = compile_value(s.priority).fn if s.priority else None
    fair_share = (FairShare(s.tenant_header, s.tenant_weights, s.tenant_default_weight, s.priority_aging)
                  if s.fair() else None)
    level_fn = None
    if fair_share is None and priority_fn is not None:
        level_fn = level_function(priority_fn, priority_level)
    elif s.sort_key:
        level_fn = level_function(compile_value(s.sort_key).fn, sort_level)
    return level_fn, priority_fn, fair_share


def judge(q: Queue, seq: int, headers: dict[str, str], payload: bytes, topic: str) -> tuple[int, object] | None:
    """What an entering message's content decides in an ordered or last-value queue:
    its level and its last-value key. None when the content cannot be evaluated
    (``expr.Unevaluable``, or anything the ordering raises on it): the message is set
    aside as poison (``poison``), live and at recovery alike, and fails alone. The key
    is read first: ``level_of`` moves a fair queue's tag, which must not move for a
    message that does not enter."""
    try:
        lvq_fn = q.last_values.fn
        key = lvq_fn(headers, payload, topic) if lvq_fn is not None else None
        return (level_of(q, seq, headers, payload, topic) if q.ordered else 0), key
    except Exception as exc:  # noqa: BLE001 -- one message's content must never stop the dispatcher
        poison(q, seq, exc)
        return None


def poison(q: Queue, seq: int, exc: Exception) -> None:
    """Set aside a message that never entered: it expires with reason ``poison`` (and
    is dead-lettered with the error) as soon as the engine drains this queue."""
    q.published += 1
    q.expired += 1
    q.poisoned += 1
    q.poison_errors[seq] = str(exc) if isinstance(exc, Unevaluable) else str(Unevaluable(exc))
    q.expired_out.append((seq, R.REASON_POISON, 0, None))


def level_of(q: Queue, seq: int, headers: dict[str, str], payload: bytes, topic: str) -> int:
    """An ordered queue's level for a message entering it (called once per entry:
    a fair queue moves its tenant's tag on)."""
    fs = q.fair_share
    if fs is not None:
        pfn = q.priority_fn
        return fs.level(seq, headers, pfn(headers, payload, topic) if pfn is not None else None)
    fn = q.level_fn
    return fn(headers, payload, topic) if fn is not None else 0


def enqueue(q: Queue, seq: int, gid: int, level: int = 0) -> None:
    if q.ordered:
        enqueue_ranked(q, seq, gid, (level << 64) | seq)
        return
    q.fifo.append(seq)
    if q.grouped:
        q.fifo_gid.append(gid)
        if gid:
            q.groups[gid].count += 1
    q.depth += 1
    q.published += 1
    q.dirty = True


def enqueue_run(q: Queue, first: int, count: int) -> None:
    """``count`` messages of no group from ``first`` on (an unordered queue): one
    extend of the fifo, not ``count`` calls of ``enqueue``."""
    q.fifo.extend(range(first, first + count))
    if q.grouped:
        q.fifo_gid.extend(array("I", bytes(4 * count)))
    q.depth += count
    q.published += count
    q.dirty = True


def enqueue_ranked(q: Queue, seq: int, gid: int, key: int) -> None:
    """Ordered queues: an ungrouped message joins the heap; a grouped one waits in its
    group (publish order), and the group's head competes by its rank in ``ready``."""
    q.depth += 1
    q.published += 1
    q.dirty = True
    if gid and q.grouped:
        grp = q.groups[gid]
        grp.count += 1
        q.ranks[seq] = key
        grouping.park(q, grp, seq)
        return
    heapq.heappush(q.returned, key)
    if q.heap_oldest is not None and seq < q.heap_oldest:
        q.heap_oldest = seq
