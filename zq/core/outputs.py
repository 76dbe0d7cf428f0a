"""The step's outputs: what a queue's changes become in the journal and on the wire.

Queues collect what happened to them during a step (leases, cancels, expiries,
delays) in their own outboxes; the engine turns those into journal records here, in
an order recovery relies on: causes (a cancel, a lease expiry) before the delays and
expiries they led to, and an expired message's dead-letter copy before its expiry
(any prefix of the journal that has the expiry has the copy too). It also asks
reclaimable holders for unstarted work a hungry subscription could do (``Revoke``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zq.core import records as R
from zq.core.effects import Revoke

if TYPE_CHECKING:
    from zq.core.admission import Admission
    from zq.core.host import Host
    from zq.core.queue import Queue
    from zq.core.routing import Routes
    from zq.core.timeindex import TimeIndex


class Outputs:
    """Flushes queues' outboxes into the step's records; collects the step's revokes."""

    def __init__(self, host: Host, routes: Routes, admission: Admission, times: TimeIndex) -> None:
        self.host = host
        self.routes = routes
        self.admission = admission
        self.times = times
        self.revokes: list[Revoke] = []  # this step's (``plan_revokes``); the drain hands them out

    def take_revokes(self) -> list[Revoke]:
        revokes = self.revokes
        if revokes:
            self.revokes = []
        return revokes

    def plan_revokes(self, q: Queue) -> None:
        """Reclaiming: ask holders for unstarted work a hungry subscription could do. The
        decision runs only when the queue's counters moved since one that found nothing."""
        key = (q.delivered, q.acked, q.cancelled, q.expired, q.ledger.lease_expiries, q.ledger.consumers_gone, q.reclaiming.reclaimed,
               len(q.subs))
        if key == q.reclaiming.seen:
            return
        plan = q.reclaiming.plan()
        if not plan:
            if not any(s.revoking for s in q.subs):
                q.reclaiming.seen = key
            return
        for sub, seqs, epochs in plan:
            self.revokes.append(Revoke(sub.sub_id, q.name, seqs, epochs))

    def flush_expired(self, q: Queue) -> None:
        """Journal this step's expiries, one ``expired`` event per reason, each after the
        dead letters it makes (see below)."""
        host = self.host
        expired, q.expired_out = q.expired_out, []
        by_reason: dict[str, list[tuple[int, str, int, str | None]]] = {}
        for item in expired:
            by_reason.setdefault(item[1], []).append(item)
        for reason, items in by_reason.items():
            seqs = [it[0] for it in items]
            ds = [it[2] for it in items]
            if reason != R.REASON_BARRIER:
                for seq, d in zip(seqs, ds):
                    if d:
                        q.recently_dead.remember(seq)
            errors = [q.poison_errors.pop(seq, "") for seq in seqs] if reason == R.REASON_POISON else []
            target = q.settings.dead_letter
            if target and reason not in R.NOT_DEAD_LETTERED:
                # The copies take their bookmarks before the expiry does: any prefix of the
                # journal (what a standby holds when its leader dies) that has the expiry
                # has the dead letters too (a prefix with copies only delivers twice).
                for i, (seq, _, d, group) in enumerate(items):
                    self.publish_dead_letter(q, target, seq, reason, d, group, errors[i] if errors else "")
            host.records.append(R.Event(host.take_seq(), host.now_ms, R.EXPIRED, q.name, "", seqs, ds, reason,
                                        errors=errors))
            if errors:
                host.notices.append(f"queue {q.name[:80]!r}: {len(seqs)} message(s) could not be evaluated and were "
                                    f"set aside as poison (bookmark {seqs[0]}: {errors[0]})")

    def publish_dead_letter(
        self, q: Queue, target: str, seq: int, reason: str, deliveries: int, group: str | None, error: str = ""
    ) -> None:
        """Publish an expired message's copy to ``target`` (the journal copies the payload).

        The engine holds no headers, so a dead-letter queue groups the copy by the
        source queue's group when both queues use the same group header (the default);
        recovery reads the copied headers and agrees.
        """
        host = self.host
        headers = {
            "zq.reason": reason,
            "zq.queue": q.name,
            "zq.deliveries": str(deliveries),
            "zq.bookmark": str(seq),
        }
        causes = q.ledger.done.get(seq) or q.ledger.open.get(seq)
        if causes is not None:  # why its deliveries ended unfinished, by cause
            headers.update({"zq.cancelled": str(causes.cancelled), "zq.failed": str(causes.failed),
                            "zq.lease_expired": str(causes.lease_expired),
                            "zq.consumer_gone": str(causes.consumer_gone),
                            "zq.first_failure_ms": str(causes.first_ms), "zq.last_failure_ms": str(causes.last_ms)})
            if causes.last_error:
                headers["zq.error"] = causes.last_error
            if causes.last_consumer:
                headers["zq.consumer"] = causes.last_consumer
        if error:  # poison: why its content could not be evaluated
            headers["zq.error"] = error
        reclaimed = q.reclaiming.done.get(seq) or q.reclaiming.given.get(seq)
        if reclaimed:  # given back unstarted this often (not counted in zq.deliveries' limit)
            headers["zq.reclaimed"] = str(reclaimed)
        queues = self.routes.route_or_create(target, dead_letter=False, strict=False)
        new_seq = host.take_seq()
        host.records.append(R.Message(new_seq, host.now_ms, target, headers, b"", None, copy_of=seq))
        self.times.note(host.now_ms, new_seq)
        for dq in queues:
            if dq.filter is not None:
                m = host.message(new_seq)
                if m is None or not dq.filter(m.headers, m.payload, m.topic):
                    continue
            gid = 0
            if group is not None and dq.grouped and dq.settings.group_header == q.settings.group_header:
                if dq.can_take_group(group):
                    gid = dq.group_id(group)
            self.admission.enqueue_copy(dq, new_seq, gid)
        q.dead_lettered += 1

    def flush_events(self, q: Queue) -> None:
        """Journal this step's lease changes of ``q``, one event per kind, consumer and reason."""
        host = self.host
        if q.events_out:
            events, q.events_out = q.events_out, {}
            for (kind, consumer, reason), batch in events.items():
                seqs = [s for s, _ in batch]
                ds = [d for _, d in batch]
                host.records.append(R.Event(host.take_seq(), host.now_ms, kind, q.name, consumer, seqs, ds, reason,
                                            host.consumer_names.get(consumer, "")))
        if q.delays_out:  # after their causes (a cancel, a lease expiry)
            self.flush_delays(q)

    def flush_delays(self, q: Queue) -> None:
        """Journal this step's delays, one ``delayed`` event per reason: after a restart
        a message waits for the rest of its time, not again from the start."""
        host = self.host
        delays, q.delays_out = q.delays_out, []
        by_reason: dict[str, list[tuple[int, int, int, str]]] = {}
        for item in delays:
            by_reason.setdefault(item[3], []).append(item)
        for reason, items in by_reason.items():
            host.records.append(R.Event(host.take_seq(), host.now_ms, R.DELAYED, q.name, "", [it[0] for it in items],
                                        [it[1] for it in items], reason, "", [it[2] for it in items]))
