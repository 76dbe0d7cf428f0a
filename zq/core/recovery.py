"""Recovery: the journal folded back into queues, and the points it starts from.

Recovery is a pure fold (``Engine.recover``): the queues declared at run time are
loaded, the events at or above the lowest recovery point say which messages are done
(acked, expired, taken by an at-most-once lease), how often each was delivered and
cancelled, which wait for a delay and why their deliveries ended; then every message
of those records returns to each queue it was in, in its original order, with those
counts. A queue's *recovery point* is the bookmark below which it is finished with
every record; ``RecoveryPoints`` journals the ones that moved, a few queues each
interval, so that recovery reads little and retention may delete the rest.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import msgspec

from zq.core import deadlines, entering, inventory, limits
from zq.core import records as R
from zq.core.errors import ZqError
from zq.core.settings import QueueSettings

if TYPE_CHECKING:
    from zq.core.host import Host
    from zq.core.queue import Queue
    from zq.core.routing import Routes
    from zq.core.timeindex import TimeIndex


class RecoveryPoints:
    """Which recovery points the journal holds, and which queues' may have moved."""

    def __init__(self, host: Host, times: TimeIndex) -> None:
        self.host = host
        self.times = times
        self.written: dict[str, int] = {}
        self.due_ms = 0
        self.visited: list[Queue] = []  # queues visited since the recovery points were last written
        self.ring: list[Queue] = []  # every queue, in turn: a slice of them each interval
        self.ring_at = 0
        self.ring_made = -1  # ``queues_made`` when the ring was built

    def visit(self, q: Queue) -> None:
        """``q`` was visited: its point is computed again at the next interval."""
        if not q.rp_pending:
            q.rp_pending = True
            self.visited.append(q)

    def write_if_due(self, now: int) -> None:
        if now >= self.due_ms:
            self.due_ms = now + limits.RECOVERY_POINT_INTERVAL_MS
            self.write()

    def write(self) -> None:
        """Journal the recovery points that moved: of the queues visited since the last
        interval, and of a slice of the others in turn, every queue at least once per
        ``RECOVERY_POINT_REFRESH_MS`` (an idle empty queue's point is the next bookmark,
        which moves; an older point is always safe: recovery reads a little more). Every
        queue's every second made 10,000 idle queues a 10,000-record commit a second."""
        host = self.host
        queues = host.queues
        if self.ring_made != host.queues_made:
            self.ring = list(queues.values())
            self.ring_at = 0
            self.ring_made = host.queues_made
        ring = self.ring
        share = len(ring) * limits.RECOVERY_POINT_INTERVAL_MS // limits.RECOVERY_POINT_REFRESH_MS + 1
        at = self.ring_at
        todo = self.visited + ring[at:at + share]
        self.ring_at = at + share if at + share < len(ring) else 0
        self.visited = []
        next_seq = host.next_seq
        for q in todo:
            q.rp_pending = False
            if queues.get(q.name) is not q:
                self.ring_made = -1  # deleted or replaced: the ring is built again next time
                continue
            rp = inventory.compute_recovery_point(q, next_seq)
            q.rp = rp
            if self.written.get(q.name) != rp:
                self.written[q.name] = rp
                host.records.append(R.RecoveryPoint(q.name, rp, host.now_ms))
                host.tables_changes += 1
        lowest = next_seq
        for q in queues.values():  # (those not computed now: as last computed, never above what it is)
            if q.rp < lowest:
                lowest = q.rp
        self.times.prune(lowest)

    def lowest(self) -> int:
        """Below this, every queue is finished with every record (retention may delete)."""
        host = self.host
        rps = [inventory.compute_recovery_point(q, host.next_seq) for q in host.queues.values()]
        return min(rps, default=host.next_seq)


def load_declared(host: Host, declared: Iterable[R.QueueDeclared]) -> None:
    """Add the queues declared at run time (config wins over run-time declarations)."""
    for d in declared:
        settings = msgspec.json.decode(d.settings_json, type=QueueSettings)
        if settings.name not in host.queues:
            try:
                host.add_queue(settings.validate(), declare=False)
            except ZqError as exc:
                # Declared by an older zq that checked less (a filter of 1e999, a
                # backtracking topics pattern): not loaded, so it cannot stop the
                # dispatcher; its messages stay in the journal.
                host.notices.append(f"run-time queue {settings.name[:80]!r} not loaded: {exc}; "
                                    "`zq queue create` it again to replace it")


class Replay:
    """Recovery's fold, per queue: which messages are done, their (deliveries, cancels)
    counts, their delays' due times and why their deliveries ended; then the messages
    themselves, put back."""

    def __init__(self, host: Host, routes: Routes, times: TimeIndex) -> None:
        self.host = host
        self.routes = routes
        self.times = times
        names = list(host.queues)
        self.done: dict[str, set[int]] = {name: set() for name in names}
        self.counts: dict[str, dict[int, list[int]]] = {name: {} for name in names}
        self.delays: dict[str, dict[int, int]] = {name: {} for name in names}
        self.causes: dict[str, CauseFold] = {name: CauseFold() for name in names}

    def fold_events(self, events: Iterable[R.Event]) -> None:
        queues = self.host.queues
        for ev in events:
            q = queues.get(ev.queue)
            if q is None:
                continue
            fold_event(q, ev, self.done[ev.queue], self.counts[ev.queue], self.delays[ev.queue])
            if not q.at_most_once:
                self.causes[ev.queue].fold(ev)

    def replay(self, messages: Iterable[R.Message], recovery_points: dict[str, int]) -> None:
        """Every message returns to each queue it is in and not done with."""
        starts = {name: max(recovery_points.get(name, q.settings.start_seq), q.settings.start_seq)
                  for name, q in self.host.queues.items()}
        done = self.done
        for msg in messages:
            self.times.note(msg.ts_ms, msg.seq)
            for q in self.routes.route(msg.topic):
                if msg.seq < starts[q.name] or msg.seq in done[q.name]:
                    continue
                self.restore(q, msg)

    def restore(self, q: Queue, msg: R.Message) -> None:
        """Put ``msg`` back in ``q`` as it was: filtered, judged, grouped, counted, delayed."""
        if q.filter is not None:
            m = msg if msg.copy_of is None else self.host.message(msg.seq)
            if m is None or not q.filter(m.headers, m.payload, m.topic):
                return
        due = self.delays[q.name].get(msg.seq, 0)
        if q.target.limit and not q.target.admit(msg.seq):
            if due:
                q.target.due[msg.seq] = due
            return  # stays in the journal: read in as the queue drains
        level, key = 0, None
        if q.ordered or q.last_values.fn is not None:
            m = msg if msg.copy_of is None else self.host.message(msg.seq)
            if m is not None:
                judged = entering.judge(q, msg.seq, m.headers, m.payload, m.topic)
                if judged is None:
                    return  # poison (journaled by a zq that let it in): set aside, said at the first drain
                level, key = judged
        gid = 0
        barrier = q.barrier.fn is not None and q.barrier.fn(msg.headers, msg.payload, msg.topic)
        if q.grouped and not barrier:
            name = msg.headers.get(q.settings.group_header)  # type: ignore[arg-type]
            if name is not None and q.can_take_group(name):
                gid = q.group_id(name)
        entering.enqueue(q, msg.seq, gid, level)
        if barrier:
            q.barrier.waiting.append(msg.seq)
        if key is not None:
            q.last_values.admit(msg.seq, key)
        if q.overflow.sizes is not None:
            q.overflow.sizes[msg.seq] = len(msg.payload)
            q.overflow.bytes += len(msg.payload)
        c = self.counts[q.name].get(msg.seq)
        if c is not None:
            q.restore_counts(msg.seq, gid, c[0], c[1])
            self.causes[q.name].restore(q, msg.seq)
        if due and not barrier and not q.browse:  # it waits for the rest of its time (advance wakes it)
            q.mark_delayed(msg.seq, gid, due, R.DELAY_BACKOFF, journal=False)
        deadline = deadlines.deadline_of(msg.headers) if msg.copy_of is None else 0
        if deadline and not barrier and not q.browse:  # past already: the first advance expires it
            q.deadlines.mark(msg.seq, deadline)

    def finish(self, recovery_points: dict[str, int], written: dict[str, int]) -> None:
        """What the fold leaves for the first step: counters from zero, early acks of
        inactive messages, the points as journaled, exhausted messages expired."""
        host = self.host
        for q in host.queues.values():
            q.published = 0
            if q.target.inactive:  # acknowledged before they were read in: skip them when they are
                q.target.early_acks = {s for s in self.done[q.name] if s >= q.target.cursor}
            written[q.name] = recovery_points.get(q.name, -1)
            if not q.at_most_once and (q.settings.max_deliveries or q.ledger.limited()):
                expire_exhausted(q)
            host.names_to_forget.extend(self.causes[q.name].named)


def fold_event(q: Queue, ev: R.Event, done: set[int], counts: dict[int, list[int]], delays: dict[int, int]) -> None:
    kind = ev.kind
    if kind in (R.ACKED, R.EXPIRED) or (kind == R.LEASED and q.at_most_once):
        done.update(ev.bookmarks)
        if kind == R.EXPIRED and ev.reason != R.REASON_BARRIER:
            for seq, d in zip(ev.bookmarks, ev.deliveries):
                if d:
                    q.recently_dead.remember(seq)
    elif kind == R.DELAYED:
        delays.update(zip(ev.bookmarks, ev.due_ms))
    elif kind == R.LEASED:
        if delays:
            for seq in ev.bookmarks:
                delays.pop(seq, None)  # delivered since: that delay is over
        for seq, d in zip(ev.bookmarks, ev.deliveries):
            c = counts.get(seq)
            if c is None:
                counts[seq] = [d, 0]
            elif d > c[0]:
                c[0] = d
    elif kind == R.CANCELLED:
        for seq in ev.bookmarks:
            c = counts.setdefault(seq, [0, 0])
            c[1] += 1


def expire_exhausted(q: Queue) -> None:
    """Recovery: a message whose deliveries ran out while leased (or whose consumers
    went away, with this crash, as often as ``max_consumer_gone`` allows) expires now,
    as it would have when its lease broke."""
    limit = q.settings.max_deliveries
    gone = q.settings.max_consumer_gone
    for seq in list(q.meta):
        reason = ""
        if limit and q.counted_deliveries(seq, q.meta[seq]) >= limit:
            reason = R.REASON_MAX_DELIVERIES
        elif gone and (c := q.ledger.open.get(seq)) is not None and c.consumer_gone >= gone:
            reason = R.REASON_MAX_CONSUMER_GONE
        if reason and q.remove_available(seq):
            q.expired_out.append((seq, reason, q.deliveries_of(seq), q.group_name_of(seq)))
            q.expired += 1


class CauseFold:
    """Recovery's account of why deliveries ended unfinished, per message, from the
    events: cancels (with an error: failed), lease expiries, consumers gone; a delivery
    still open when the journal ends was cut by the dispatcher's death: consumer gone."""

    def __init__(self) -> None:
        self.counts: dict[int, list[int]] = {}  # seq -> [cancelled, failed, expired, gone, first ms, last ms]
        self.last: dict[int, tuple[str, str]] = {}  # seq -> (last error, last consumer)
        self.open: dict[int, tuple[int, str, str, int]] = {}  # seq -> (ts, name, consumer, deliveries): not ended
        self.named: list[str] = []  # consumers whose HELLO names recovery put back for its events
        self.reclaims: dict[int, int] = {}  # seq -> times given back unstarted

    def fold(self, ev: R.Event) -> None:
        kind = ev.kind
        if kind == R.LEASED:
            who = ev.consumer_name or ev.consumer
            for seq, d in zip(ev.bookmarks, ev.deliveries):
                self.open[seq] = (ev.ts_ms, who, ev.consumer, d)
            return
        if kind in (R.ACKED, R.EXPIRED):
            for seq in ev.bookmarks:
                self.open.pop(seq, None)
            return
        if kind == R.RECLAIMED:  # given back unstarted: that delivery ended, and counts for nothing
            for seq in ev.bookmarks:
                self.open.pop(seq, None)
                self.reclaims[seq] = self.reclaims.get(seq, 0) + 1
            return
        if kind == R.CANCELLED:
            slot = 1 if ev.reason else 0
        elif kind == R.LEASE_EXPIRED:
            slot = 2
        elif kind == R.RETURNED:
            slot = 3
        else:
            return
        who = ev.consumer_name or ev.consumer
        for seq in ev.bookmarks:
            self.open.pop(seq, None)
            self.note(seq, slot, ev.ts_ms, ev.reason if slot == 1 else None, who)

    def note(self, seq: int, slot: int, ts_ms: int, error: str | None, who: str) -> None:
        c = self.counts.get(seq)
        if c is None:
            c = self.counts[seq] = [0, 0, 0, 0, ts_ms, ts_ms]
        c[slot] += 1
        c[5] = max(c[5], ts_ms)
        old_error = self.last.get(seq, ("", ""))[0]
        self.last[seq] = (error if error is not None else old_error, who)

    def restore(self, q: Queue, seq: int) -> None:
        opened = self.open.pop(seq, None)
        if opened is not None:  # held when the dispatcher died: journaled, so the next recovery counts it once
            self.note(seq, 3, opened[0], None, opened[1])
            q.note_event(R.RETURNED, opened[2], seq, opened[3], R.RETURN_RESTART)
            if opened[1] != opened[2]:  # the event names the consumer as it named itself (then forgotten)
                q.ledger.names[opened[2]] = opened[1]
                self.named.append(opened[2])
        c = self.counts.get(seq)
        if c is not None:
            error, who = self.last[seq]
            q.restore_causes(seq, c, error, who)
        n = self.reclaims.get(seq)
        if n:
            q.reclaiming.given[seq] = n
