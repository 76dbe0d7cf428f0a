"""Operator actions on queues: replace a subscription, ack / purge / move / redrive by
filter, list groups, declare and delete queues at run time.

They live apart from the dispatch path (``engine.py``) because they are rare,
operator-driven and may touch many messages. A bulk action (purge, move, ack-filter,
redrive) runs in slices of ``limits.BULK_SLICE`` messages read (``BULK_COPY_SLICE``
copied, for move and redrive), in bookmark order,
resuming from a ``BulkCursor``: the dispatcher runs one slice per loop iteration and
serves everyone else between them. Each slice journals what it removed as events, so
recovery agrees with what the operator saw. A slice sees the queue as it is then:
messages published after the action began are not its, and a message returned to the
queue behind the cursor (a lease expired) stays.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mypy_extensions import trait

import msgspec

from zq.core import expr, inventory, leases, limits, removal
from zq.core import records as R
from zq.core.leases import D_MASK, G_SHIFT
from zq.core.errors import ConfigError, ProtocolError, QueueExistsError, UnknownQueueError
from zq.core.settings import QueueSettings, check_topic, covers_topic

if TYPE_CHECKING:
    from collections.abc import Callable

    from zq.core.queue import Queue

REASON_PURGED = "purged"
REASON_MOVED = "moved"
REASON_REDRIVEN = "redriven"


class BulkCursor:
    """Where a bulk operator action (purge, move, ack-filter, redrive) stands between
    slices: the last bookmark read, and the first bookmark that is not the action's
    (published after it began: a purge of a busy queue ends)."""

    __slots__ = ("after", "end", "done", "match")

    def __init__(self, end: int) -> None:
        self.after = 0
        self.end = end
        self.done = False
        self.match: Callable[[int], bool] | None = None


@trait  # mypyc: a compiled class may mix in traits only
class ManagementMixin:
    """Engine methods for operators; see the module docstring."""

    # Provided by Engine:
    queues: dict[str, Queue]
    records: list[Any]
    now_ms: int
    expr_limits: expr.ExprLimits
    tables_changes: int
    provisional: set[str]

    # ------------------------------------------------------- subscriptions

    def replace(self, sub_id: str, queue: str, max_backlog: int, filter: str | None, now_ms: int) -> int:
        """Change a subscription's filter and backlog in place; leases stay as they are.

        The backlog is recomputed as on subscribe. Moving to another queue is allowed
        only while the subscription holds nothing (its leases belong to the old queue).
        """
        self.set_time(now_ms)  # type: ignore[attr-defined]
        sub = self.sub(sub_id)  # type: ignore[attr-defined]
        if max_backlog < 1:
            raise ProtocolError(f"max_backlog must be at least 1, got {max_backlog}")
        match = self.matcher(expr.compile_filter(filter, self.expr_limits)) if filter else None  # type: ignore[attr-defined]
        if queue != sub.queue.name:
            if sub.used:
                raise ProtocolError(f"cannot move a subscription holding {sub.used} messages to another queue; "
                                    "settle them first")
            consumer, reclaimable = sub.consumer, sub.reclaimable
            if reclaimable and ((to := self.queues.get(queue)) is not None  # type: ignore[attr-defined]
                                and (to.at_most_once or to.browse)):
                raise ProtocolError(f"a reclaimable subscription cannot move to {queue!r}: its deliveries cannot "
                                    "be taken back (an at-least-once queue is needed)")
            self.unsubscribe(sub_id, now_ms)  # type: ignore[attr-defined]
            return self.subscribe(sub_id, queue, consumer, max_backlog, now_ms, filter=filter,  # type: ignore[attr-defined]
                                  reclaimable=reclaimable)
        q = sub.queue
        if (match is None) != (sub.match is None):
            q.filtered += 1 if match is not None else -1
        sub.match, sub.filter_text = match, filter or None
        sub.skip_gen = -1  # the new filter judges every set-aside message afresh
        sub.backlog = min(q.settings.max_per_subscription_backlog, max_backlog)
        sub.held_back = 0  # (credit withheld after a reclaim: the new backlog replaces it)
        q.credit_opened(sub)
        return sub.backlog

    # ------------------------------------------------------------ selection

    def select(self, q: Queue, match: Callable[[int], bool] | None, cursor: BulkCursor, group: str | None = None,
               leased: bool = False, take: int = 0) -> list[tuple[int, int]]:
        """The next slice of ``q``'s waiting messages matching, in bookmark order, as
        (bookmark, group id): at most ``limits.BULK_SLICE`` are read and, with ``take``,
        at most that many picked; ``cursor`` moves past them. With ``leased``, the first
        slice also takes every leased one (their number is bounded by the credit)."""
        take = take or limits.BULK_SLICE
        gid: int | None = None
        if group is not None:
            gid = q.gid_of.get(group)
            if gid is None:
                cursor.done = True
                return []
        out: list[tuple[int, int]] = []
        if leased and cursor.after == 0:
            for seq in q.lease_of:
                if seq < cursor.end and (match is None or match(seq)):
                    out.append((seq, 0))
        read = 0
        for seq, g in inventory.waiting_between(q, cursor.after, cursor.end, gid):
            if read >= limits.BULK_SLICE or len(out) >= take:
                break
            read += 1
            cursor.after = seq
            if match is None or match(seq):
                out.append((seq, g))
        else:
            cursor.done = True
        return out

    def take_out(self, q: Queue, picked: list[tuple[int, int]], kind: str, consumer: str,
                 reason: str = "", leased: bool = False) -> list[int]:
        """Remove the picked (bookmark, group id) messages of ``q`` now, journaling ``kind``
        (acked / expired) for each; the groups stop counting them at once. A leased one
        is taken only with ``leased`` (ack-filter on a shared queue)."""
        done = []
        for seq, gid in picked:
            lease = q.lease_of.get(seq)
            if lease is not None:
                if not leased:
                    continue
                _, m = leases.release(q, seq)
                q.finish(seq, m >> G_SHIFT)
                q.note_event(kind, consumer, seq, m & D_MASK, reason)
            elif removal.remove_available(q, seq, known_waiting=True, gid=gid):
                q.note_event(kind, consumer, seq, q.deliveries_of(seq), reason)
            else:
                continue
            done.append(seq)
        if kind == R.ACKED:
            q.acked += len(done)
        else:
            q.expired += len(done)
        q.dirty = True
        return done

    def bulk(self, cursor: BulkCursor | None, one_slice: Callable[[BulkCursor], int]) -> int:
        """With a cursor, one slice (the dispatcher's way: it answers others between
        slices); without, every slice at once (embedded use, tests)."""
        if cursor is not None:
            return one_slice(cursor)
        cursor = self.bulk_cursor()
        total = 0
        while not cursor.done:
            total += one_slice(cursor)
        return total

    def bulk_cursor(self) -> BulkCursor:
        """A cursor for a bulk action starting now: messages published later are not its."""
        return BulkCursor(self.next_seq)  # type: ignore[attr-defined]

    def filter_of(self, cursor: BulkCursor, filter: str | None) -> Callable[[int], bool] | None:
        """The action's filter, compiled at its first slice."""
        if filter and cursor.match is None:
            cursor.match = self.matcher(expr.compile_filter(filter, self.expr_limits))  # type: ignore[attr-defined]
        return cursor.match

    def ack_filter(self, queue: str, filter: str, consumer: str, now_ms: int, cursor: BulkCursor | None = None) -> int:
        """Acknowledge every available message matching ``filter`` (and leased ones when
        the queue's ``leasing`` is ``"shared"``: their holders' acks are then refused)."""
        self.set_time(now_ms)  # type: ignore[attr-defined]

        def one_slice(c: BulkCursor) -> int:
            q = self.queue(queue)  # type: ignore[attr-defined]
            shared = q.settings.leasing == "shared"
            picked = self.select(q, self.filter_of(c, filter), c, leased=shared)
            return len(self.take_out(q, picked, R.ACKED, consumer, leased=shared))
        return self.bulk(cursor, one_slice)

    def purge(self, queue: str, now_ms: int, *, filter: str | None = None, group: str | None = None,
              cursor: BulkCursor | None = None) -> int:
        """Delete available messages (all, a group's, or a filter's matches); leased ones stay."""
        self.set_time(now_ms)  # type: ignore[attr-defined]

        def one_slice(c: BulkCursor) -> int:
            q = self.queue(queue)  # type: ignore[attr-defined]
            picked = self.select(q, self.filter_of(c, filter), c, group)
            return len(self.take_out(q, picked, R.EXPIRED, "", REASON_PURGED))
        return self.bulk(cursor, one_slice)

    def move(self, queue: str, target_topic: str, now_ms: int, *, filter: str | None = None,
             group: str | None = None, cursor: BulkCursor | None = None) -> int:
        """Publish copies of available messages to ``target_topic``, then remove them here."""
        self.set_time(now_ms)  # type: ignore[attr-defined]
        q = self.queue(queue)  # type: ignore[attr-defined]
        if not target_topic or target_topic == queue and q.covers(target_topic):
            raise ProtocolError("move needs a different target topic")
        check_topic(target_topic, "move target topic")
        self.route_or_create(target_topic)  # type: ignore[attr-defined]  # refused here (queue limit), before anything moves

        def one_slice(c: BulkCursor) -> int:
            q = self.queue(queue)  # type: ignore[attr-defined]
            picked = self.select(q, self.filter_of(c, filter), c, group, take=limits.BULK_COPY_SLICE)
            seqs = self.take_out(q, picked, R.EXPIRED, "", REASON_MOVED)
            for seq in seqs:
                headers = {"zq.reason": REASON_MOVED, "zq.queue": q.name, "zq.bookmark": str(seq)}
                self.publish_copy(target_topic, seq, headers)
            return len(seqs)
        return self.bulk(cursor, one_slice)

    def redrive(self, queue: str, now_ms: int, *, filter: str | None = None, cursor: BulkCursor | None = None) -> int:
        """Dead letters of ``queue`` back to the topic they came from, with their original
        headers and message id (no dedup: the id is the same on purpose)."""
        self.set_time(now_ms)  # type: ignore[attr-defined]

        def one_slice(c: BulkCursor) -> int:
            q = self.queue(queue)  # type: ignore[attr-defined]
            plan = []
            for seq, gid in self.select(q, self.filter_of(c, filter), c, take=limits.BULK_COPY_SLICE):
                m = self.message(seq)  # type: ignore[attr-defined]
                topic = m.headers.get("zq.topic") if m is not None else None
                if topic:
                    plan.append((seq, gid, topic))
            taken = set(self.take_out(q, [(s, g) for s, g, _ in plan], R.EXPIRED, "", REASON_REDRIVEN))
            for seq, _, topic in plan:
                if seq in taken:
                    self.publish_copy(topic, seq, {})
            return len(taken)
        return self.bulk(cursor, one_slice)

    def publish_copy(self, topic: str, source_seq: int, headers: dict[str, str]) -> int:
        """Journal a copy of ``source_seq`` on ``topic`` and enqueue it where it belongs.

        ``headers`` are added to the source's; with none, zq's own ``zq.*`` headers are
        dropped (``resolve_copy``), which is what redrive wants.
        """
        queues = self.route_or_create(topic, strict=False)  # type: ignore[attr-defined]  # (a new queue starts before the copy)
        new_seq = self.take_seq()  # type: ignore[attr-defined]
        self.records.append(R.Message(new_seq, self.now_ms, topic, headers, b"", None, copy_of=source_seq))
        self.note_time(self.now_ms, new_seq)  # type: ignore[attr-defined]
        content = self.message(new_seq)  # type: ignore[attr-defined]
        for dq in queues:
            if dq.filter is not None and (content is None or not dq.filter(content.headers, content.payload, topic)):
                continue
            gid = 0
            if dq.grouped and content is not None:
                name = content.headers.get(dq.settings.group_header)
                if name is not None and dq.can_take_group(name):
                    gid = dq.group_id(name)
            self.enqueue_copy(dq, new_seq, gid)  # type: ignore[attr-defined]
        return new_seq

    # --------------------------------------------------------------- groups

    def group_list(self, queue: str, limit: int = 1000) -> list[dict[str, Any]]:
        """Groups of a queue with their pending and in-flight counts (busiest first)."""
        q = self.queue(queue)  # type: ignore[attr-defined]
        rows = []
        for i, g in enumerate(q.groups.values()):
            if i >= limits.VIEW_SCAN_MAX:
                break
            rows.append({"group": g.name, "pending": g.count - g.inflight, "in_flight": g.inflight,
                         "owner": g.owner.consumer if g.owner is not None else None})
        rows.sort(key=lambda r: (-r["pending"] - r["in_flight"], r["group"]))
        return rows[: max(0, limit)]

    # --------------------------------------------------------------- queues

    def declare_queue(self, settings: QueueSettings, configured: Callable[[str], bool]) -> bool:
        """Create a queue at run time; it is journaled and comes back after a restart.
        Declaring a queue that exists with the same settings changes nothing (returns
        False), as AMQP's declare and SQS's CreateQueue do; with other settings it is
        refused (``exists``), naming each difference."""
        settings = settings.validate()
        existing = self.queues.get(settings.name)  # type: ignore[attr-defined]
        if existing is not None:
            differences = settings_differences(existing.settings, settings)
            if not differences:
                if existing.name in self.provisional:
                    self.keep_provisional(existing)  # type: ignore[attr-defined]  # declared now: kept
                return False
            if not (existing.name in self.provisional and not existing.meta and existing.depth == 0):
                where = "in the config file, which wins" if configured(settings.name) else "at run time"
                raise QueueExistsError(
                    f"queue {settings.name!r} exists ({where}) with other settings: {'; '.join(differences)} "
                    f"(`zq queue alter` / Client.alter_queue changes what can change on a live queue)")
            # (else only consumers made it, before anyone declared it: the declare decides)
        elif configured(settings.name):
            raise ConfigError(f"queue {settings.name!r} is defined in the config file, which wins; change it there")
        if settings.dead_letter is not None:
            self.check_dead_letter(settings.dead_letter, settings.name, settings)  # type: ignore[attr-defined]
        for q in self.queues.values():  # type: ignore[attr-defined]
            if q.settings.dead_letter == settings.name:
                self.check_dead_letter(settings.name, q.name, settings)  # type: ignore[attr-defined]
        self.check_dead_letter_loop(settings)
        if existing is not None:
            self.replace_provisional(existing, settings)
            return True
        settings = msgspec.structs.replace(settings, start_seq=self.next_seq)  # type: ignore[attr-defined]
        self.add_queue(settings)  # type: ignore[attr-defined]
        return True

    def replace_provisional(self, old: Queue, settings: QueueSettings) -> None:
        """A queue only consumers made (nothing in it, never journaled) takes the
        settings a declare gives it; its subscriptions move over."""
        from zq.core.queue import Queue as QueueClass

        settings = msgspec.structs.replace(settings, start_seq=old.settings.start_seq)
        q = QueueClass(settings)
        q.ledger.names = old.ledger.names
        q.ordinal = old.ordinal  # (it takes the old one's place among the queues)
        for sub in old.subs:
            sub.queue = q
            sub.backlog = min(sub.backlog, settings.max_per_subscription_backlog)
            q.add_subscription(sub)
        self.queues[settings.name] = q
        self.touch(q)  # type: ignore[attr-defined]
        self.route_cache.clear()  # type: ignore[attr-defined]
        self.keep_provisional(q)  # type: ignore[attr-defined]

    def check_dead_letter_loop(self, settings: QueueSettings) -> None:
        """Refuse dead letters that come back to the queue that sent them (to itself, or
        through other queues' dead letters): every expiry would feed the next, forever."""
        seen = {settings.name}
        chain = [settings.name]
        target = settings.dead_letter
        while target is not None and len(chain) <= len(self.queues) + 1:
            covering = [settings.name] if covers_topic(settings, target) else []
            covering += [q.name for q in self.route(target) if q.name != settings.name]  # type: ignore[attr-defined]
            if settings.name in covering:
                raise ConfigError(f"queue {settings.name!r}: dead_letter {settings.dead_letter!r} comes back to it "
                                  f"({' -> '.join(chain + [settings.name])}): each dead letter would expire into the "
                                  "next, forever; name another topic, or \"\" to drop them")
            nxt = next((n for n in covering if n not in seen), None)
            if nxt is None:
                return
            seen.add(nxt)
            chain.append(nxt)
            target = self.queues[nxt].settings.dead_letter
    def alter_queue(self, name: str, changes: dict[str, Any], configured: Callable[[str], bool]) -> list[str]:
        """Change settings of a live run-time queue (``ALTERABLE`` only): journaled as
        its declaration, so a restart and a standby have them. Returns what changed, as
        ``declare_queue`` names differences ([] when nothing did: nothing is journaled).
        Leases already given keep their deadlines; new deliveries take the new lease."""
        q = self.queue(name)  # type: ignore[attr-defined]
        if configured(name):
            raise ConfigError(f"queue {name!r} is defined in the config file, which wins; change it there "
                              "(and restart, or SIGHUP where it reloads)")
        fixed = sorted(k for k in changes if k not in ALTERABLE)
        if fixed:
            raise ProtocolError(f"queue {name!r}: {', '.join(fixed)} cannot change on a live queue: "
                                f"{FIXED_WHY}")
        old = q.settings
        try:
            new = msgspec.structs.replace(old, **changes).validate()
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"queue {name!r}: {exc}") from None
        if (old.max_bytes == 0) != (new.max_bytes == 0):
            raise ProtocolError(f"queue {name!r}: max_bytes can change between limits but not be turned on or off "
                                "on a live queue (the sizes of the messages it holds are kept only with a limit)")
        if new.dead_letter is not None and new.dead_letter != old.dead_letter:
            self.check_dead_letter(new.dead_letter, name)  # type: ignore[attr-defined]
            self.check_dead_letter_loop(new)
        differences = settings_differences(old, new)
        if not differences:
            return []
        q.alter(new)
        self.provisional.discard(name)  # (altered: kept, declared as it is now)
        self.records.append(R.QueueDeclared(msgspec.json.encode(new), self.now_ms))  # type: ignore[attr-defined]
        self.tables_changes += 1  # type: ignore[attr-defined]
        return differences

    def delete_queue(self, name: str, configured: Callable[[str], bool], now_ms: int) -> int:
        """Delete a run-time queue; its subscriptions end. Returns the messages it held."""
        self.set_time(now_ms)  # type: ignore[attr-defined]
        if name not in self.queues:
            raise UnknownQueueError(f"no queue named {name!r}")
        if configured(name):
            raise ConfigError(f"queue {name!r} is defined in the config file; remove it there")
        q = self.queues[name]
        for sub in list(q.subs):
            self.unsubscribe(sub.sub_id, now_ms)  # type: ignore[attr-defined]
        held = q.depth
        del self.queues[name]
        self.provisional.discard(name)
        self.route_cache.clear()  # type: ignore[attr-defined]
        self.rp_written.pop(name, None)  # type: ignore[attr-defined]
        self.records.append(R.QueueDeleted(name, now_ms))
        self.tables_changes += 1
        return held


# What can change on a live queue (``alter_queue``): limits, timings, retry schedule,
# dead-letter target, fairness among consumers, tenant weights. The rest decides which
# messages the queue holds or in what order it keeps them, fixed by the messages it holds.
ALTERABLE = frozenset({
    "lease_ms", "max_per_subscription_backlog", "max_cancels", "max_deliveries", "expiration_ms", "dead_letter",
    "fairness", "max_depth", "max_bytes", "overflow", "resume_percent", "backoff_ms", "backoff_jitter",
    "max_lease_age_ms", "max_failures", "max_lease_expiries", "max_consumer_gone", "tenant_weights",
    "tenant_default_weight",
})
FIXED_WHY = ("it decides which messages the queue holds or how it orders and groups them (topics, filter, kind, "
             "groups, priority, semantics...); create a new queue and `zq move` the messages to it")


def settings_differences(old: QueueSettings, new: QueueSettings) -> list[str]:
    """Each setting that differs, as ``key: old -> new`` (``start_seq`` is the queue's own)."""
    out = []
    for key in QueueSettings.__struct_fields__:
        if key in ("start_seq", "name"):
            continue
        a, b = getattr(old, key), getattr(new, key)
        if key == "fairness":  # None means the kind's default: the same queue either way
            a, b = old.effective_fairness(), new.effective_fairness()
        if a != b:
            out.append(f"{key}: {short(a)} -> {short(b)}")
    return out


def short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."

