"""The engine: every queue, every subscription, and what must be journaled.

Theory of operation
-------------------
Callers feed inputs (``publish``, ``subscribe``, ``ack``, ``cancel``, ``expire``,
``extend``, ``unsubscribe``, ``disconnect``, ``advance``) each carrying ``now_ms``;
then call ``drain(now_ms)``, which dispatches and returns an ``Output``: the journal
records this step produced and the deliveries to send. The adapter's contract:

1. append ``Output.records`` to the journal and commit them (one transaction);
2. only then send ``Output.deliveries`` and the publish confirmations of the step.

That order is what makes at-most-once safe (the delivery is durable before the frame
leaves) and what keeps every delivered message a committed one.

A step finds its work rather than searching for it: an input marks the queue it
changes (``touch``), each queue's next deadline (a lease's end, a delayed message, an
age limit, the expiry sweep) waits in one heap (``schedule``), and ``advance`` and
``drain`` visit only the touched queues and those whose deadline came, in the order
the queues were made. A queue nobody uses costs a step nothing, and the outputs are
those of visiting every queue (``visit_all``, which the simulator compares against).

The engine coordinates parts, each owning one idea and its state (``zq.core.host``
says what they share of the engine): ``routes`` (topic -> queues, auto-created and
provisional queues, ``zq.core.routing``), ``admission`` (publishing: checks, message-id
dedup, enqueueing, overflow, ``zq.core.admission``), ``subscriptions`` (opened,
closed, claims, ``zq.core.subscriptions``), ``times`` (publish times by
bookmark: expiry watermarks, ages, ack latencies, ``zq.core.timeindex``), ``outputs``
(queues' outboxes into journal records, revokes, ``zq.core.outputs``), ``points``
(recovery points, ``zq.core.recovery``) and ``views`` (stats, peek, query,
``zq.core.views``). What remains here is the step itself: the queues, the settles
of deliveries (ack, cancel, expire, extend), finding the queues to visit, dispatching
them, and handing out the output.

One global counter numbers messages and events alike (``records`` explains why).
Recovery is a pure fold: ``Engine.recover`` reads the records at or above the lowest
recovery point and rebuilds every queue (``zq.core.recovery``). The engine has no
clock, no socket, no disk and no randomness; ``zq.testing.simulator`` drives it from
a seed.
"""

from __future__ import annotations

import heapq
from array import array
from bisect import insort
from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from zq.core import expr, limits, transactions
from zq.core import records as R
from zq.core.admission import Admission
from zq.core.errors import (
    ConfigError,
    LimitError,
    NotSupportedError,
    ProtocolError,
    UnknownQueueError,
)
from zq.core.depth import TargetDepthMixin
from zq.core.effects import Deliver, Output, Revoke  # noqa: F401 -- also zq.core.engine's: where they were
from zq.core.host import Host
from zq.core.manage import ManagementMixin
from zq.core.outputs import Outputs
from zq.core.queue import Queue, Subscription
from zq.core.recovery import RecoveryPoints, Replay, load_declared
from zq.core.routing import Routes
from zq.core.settings import QueueSettings
from zq.core.subscriptions import Subscriptions
from zq.core.timeindex import ACK_LATENCY_BUCKETS_MS, TimeIndex, latency_key  # noqa: F401 -- where they were
from zq.core.views import Views


def ordinal_of(q: Queue) -> int:
    return q.ordinal


def sub_ordinal_of(sub: Subscription) -> int:
    return sub.ordinal


class Engine(ManagementMixin, TargetDepthMixin, Host):
    """All queue semantics of one dispatcher; see the module docstring."""

    def __init__(
        self,
        queues: Iterable[QueueSettings] = (),
        *,
        auto_queues: bool = True,
        next_seq: int = 1,
        content: Callable[[int], R.Message | None] | None = None,
        find_id: Callable[[str, str], tuple[int, int] | None] | None = None,
        scan: Callable[[int, int], list[R.Message]] | None = None,
    ) -> None:
        self.queues: dict[str, Queue] = {}
        # Bounds on the expressions clients send (filters, queries); the adapter sets
        # its config's. Queue settings' own expressions use the defaults.
        self.expr_limits: expr.ExprLimits = expr.DEFAULT_LIMITS
        # The scan port: committed messages from a bookmark on (TargetQueueDepth reads
        # a queue's inactive part back through it; see zq.core.depth).
        self.scan = scan
        # Filter evaluations one drain may make, all queues (the simulator lowers it to
        # exercise the stop-and-go-on path in every fault it injects).
        self.dispatch_budget = limits.DISPATCH_MATCHES_PER_STEP
        self.dispatch_deferred = 0  # queue dispatches left for the next step at that budget (STATS)
        self.notices: list[str] = []  # operator-worthy changes (overflow breaches); the adapter logs them
        # The content port: reads a journaled message by bookmark (filters need it).
        # Messages of the current step are not journaled yet; ``message`` finds those
        # in ``records``.
        self.content = content
        self.step_messages: dict[int, R.Message] | None = None
        self.step_indexed = 0
        self.last_content: tuple[int, R.Message | None] = (-1, None)
        self.next_seq = next_seq
        # What consumers called themselves (HELLO): written into their events, so the
        # journal's history names them; dropped once a gone consumer's last events are out.
        self.consumer_names: dict[str, str] = {}
        self.names_to_forget: list[str] = []
        self.records: list[Any] = []
        self.deliveries: list[Deliver] = []
        self.now_ms = 0
        # Records of the journal's small tables (queue declarations and deletions, recovery
        # points) made so far: a standby copies the tables again when this moved.
        self.tables_changes = 0
        # Work is found, never searched for: a step visits the queues something touched
        # this step (a command, a publish, a copy: ``touch``) and those whose time came
        # (``deadlines``, a heap of (when, ordinal, queue) with at most one live entry
        # per queue: ``schedule``), in the order the queues were made. Ten thousand idle
        # queues once cost every step ~9 ms, every bystander's round trip included.
        self.touched: list[Queue] = []
        self.deadlines: list[tuple[int, int, Queue]] = []
        self.queues_made = 0
        self.advanced_ms = 0  # the time of the last ``advance``: an idle queue's expiry watermark is as of then
        # Tests: visit every queue every step (how each step went before ``touch``), to
        # compare traces with; never set in service.
        self.visit_all = False
        # The parts (see the module docstring), each given the others it works with.
        self.times = TimeIndex()
        self.routes = Routes(self, auto_queues)
        self.subscriptions = Subscriptions(self, self.routes)
        self.admission = Admission(self, self.routes, self.times, find_id)
        self.outputs = Outputs(self, self.routes, self.admission, self.times)
        self.points = RecoveryPoints(self, self.times)
        self.views = Views(self, self.admission, self.times)
        # The same objects under the names the operator actions (ManagementMixin) and
        # the adapters use; each is only changed in place.
        self.subs = self.subscriptions.subs
        self.provisional = self.routes.provisional
        self.route_cache = self.routes.cache
        self.rp_written = self.points.written
        self.add_configured(queues)

    def add_configured(self, queues: Iterable[QueueSettings]) -> None:
        """The queues of the configuration: checked together (a dead letter may name a
        queue declared after it)."""
        for settings in queues:
            self.add_queue(settings.validate(), declare=False)
        for q in self.queues.values():
            if q.settings.dead_letter is not None:
                self.routes.check_dead_letter(q.settings.dead_letter, q.name)

    # ------------------------------------------------------------- queues

    def add_queue(self, settings: QueueSettings, *, declare: bool = True) -> Queue:
        if settings.name in self.queues:  # a queue is never replaced by another of its name
            raise ProtocolError(f"queue {settings.name!r} already exists")
        if len(self.queues) >= limits.QUEUES_MAX:
            raise LimitError(f"too many queues (max {limits.QUEUES_MAX})")
        if settings.target_queue_depth and self.scan is None:
            raise ConfigError(f"queue {settings.name!r}: target_queue_depth needs an engine with a journal scan port")
        q = Queue(settings)
        q.ledger.names = self.consumer_names  # shared: causes name the consumer as it named itself
        self.queues_made += 1
        q.ordinal = self.queues_made
        self.queues[settings.name] = q
        self.touch(q)
        self.routes.cache.clear()
        if declare:
            self.records.append(R.QueueDeclared(msgspec.json.encode(settings), self.now_ms))
            self.tables_changes += 1
        return q

    def queue(self, name: str) -> Queue:
        """The queue named ``name``, for a change to it: this step visits it."""
        q = self.queues.get(name)
        if q is None:
            raise UnknownQueueError(f"no queue named {name!r}")
        self.touch(q)
        return q

    def touch(self, q: Queue) -> None:
        """Something may have changed ``q``: this step's advance and drain visit it. Its
        expiry watermark is brought to the last advance's, as if it had been visited
        then (it had nothing due, or it would have been)."""
        if q.touched:
            return
        q.touched = True
        self.touched.append(q)
        self.points.visit(q)
        if q.advanced_ms != self.advanced_ms:
            q.expired_watermark = self.times.watermark_at(q, self.advanced_ms, self.next_seq)

    def deadline_of(self, q: Queue) -> int | None:
        """``q``'s next deadline: a lease's end, a delayed message, an age limit or sweep."""
        d = q.next_deadline_ms()
        e = self.times.next_expiry_ms(q, self.now_ms)
        return e if e is not None and (d is None or e < d) else d

    def schedule(self, q: Queue) -> None:
        """Put ``q``'s next deadline in the heap when it is sooner than the one there (a
        later one is found when the earlier entry comes due and ``q`` is visited)."""
        d = self.deadline_of(q)
        if d is not None and (q.scheduled_ms < 0 or d < q.scheduled_ms):
            q.scheduled_ms = d
            heapq.heappush(self.deadlines, (d, q.ordinal, q))

    def visiting(self) -> list[Queue]:
        """This step's touched queues that still exist, in the order they were made."""
        touched = [q for q in self.touched if self.queues.get(q.name) is q]
        if len(touched) > 1:
            touched.sort(key=ordinal_of)
        self.touched = touched
        return touched

    # ------------------------------------------------- routing (zq.core.routing)

    def route(self, topic: str) -> list[Queue]:
        return self.routes.route(topic)

    def route_or_create(self, topic: str, *, dead_letter: bool = True, strict: bool = True) -> list[Queue]:
        return self.routes.route_or_create(topic, dead_letter=dead_letter, strict=strict)

    def keep_provisional(self, q: Queue) -> None:
        self.routes.keep_provisional(q)

    def check_dead_letter(self, target: str, source: str, new: QueueSettings | None = None) -> None:
        self.routes.check_dead_letter(target, source, new)

    # --------------------------------------------- publishing (zq.core.admission)

    def publish(
        self,
        topic: str,
        payload: bytes,
        headers: dict[str, str] | None,
        now_ms: int,
        msg_id: str | None = None,
        not_before_ms: int = 0,
        deadline_ms: int = 0,
    ) -> int:
        """Journal one message and enqueue it on every queue covering its topic.

        Returns its bookmark. Raises ProtocolError / LimitError for a bad message,
        before anything is journaled. (A batch of one: see ``publish_many``.)
        """
        return self.admission.publish_many(topic, [(payload, headers or {}, msg_id)], now_ms,
                                           not_before_ms=not_before_ms, deadline_ms=deadline_ms)[0]

    def publish_many(self, topic: str, items: list[tuple[bytes, dict[str, str], str | None]], now_ms: int,
                     max_message_bytes: int = limits.MESSAGE_BYTES_MAX, not_before_ms: int = 0,
                     deadline_ms: int = 0) -> list[int]:
        return self.admission.publish_many(topic, items, now_ms, max_message_bytes, not_before_ms, deadline_ms)

    def enqueue_copy(self, q: Queue, seq: int, gid: int) -> None:
        self.admission.enqueue_copy(q, seq, gid)

    def withheld(self, topic: str) -> list[str]:
        return self.admission.withheld(topic)

    @property
    def published(self) -> int:
        return self.admission.published

    def take_seq(self) -> int:
        seq = self.next_seq
        self.next_seq += 1
        return seq

    def set_time(self, now_ms: int) -> None:
        if now_ms > self.now_ms:
            self.now_ms = now_ms

    # ------------------------------------------- time index (zq.core.timeindex)

    def note_time(self, now_ms: int, seq: int) -> None:
        self.times.note(now_ms, seq)

    def watermark(self, q: Queue) -> int:
        """Highest seq published at or before now - expiration (-1: none expired)."""
        return self.times.watermark_at(q, self.now_ms, self.next_seq)

    def next_expiry_ms(self, q: Queue) -> int | None:
        return self.times.next_expiry_ms(q, self.now_ms)

    @property
    def ti_ms(self) -> array[int]:
        return self.times.ms

    # ------------------------------------- subscriptions (zq.core.subscriptions)

    def subscribe(self, sub_id: str, queue: str, consumer: str, max_backlog: int, now_ms: int,
                  filter: str | None = None, consumer_name: str = "", reclaimable: bool = False) -> int:
        return self.subscriptions.subscribe(sub_id, queue, consumer, max_backlog, now_ms, filter, consumer_name,
                                            reclaimable)

    def matcher(self, compiled: expr.Compiled) -> Callable[[int], bool]:
        """A predicate over bookmarks: reads the message through the content port."""
        if self.content is None:
            raise NotSupportedError("content filters need an engine with a content reader (a journal)")
        fn = compiled.fn
        message = self.message

        def match(seq: int) -> bool:
            m = message(seq)
            return m is not None and fn(m.headers, m.payload, m.topic)

        return match

    def message(self, seq: int) -> R.Message | None:
        """The message ``seq`` with its payload and headers (dead letters resolved)."""
        last_seq, last = self.last_content
        if last_seq == seq:
            return last
        m = self.content(seq) if self.content is not None else None
        if m is None:
            if self.step_messages is None:
                self.step_messages, self.step_indexed = {}, 0
            m = self.step_messages.get(seq)
            if m is None and self.step_indexed < len(self.records):
                for r in self.records[self.step_indexed:]:
                    if type(r) is R.Message:
                        self.step_messages[r.seq] = r
                self.step_indexed = len(self.records)
                m = self.step_messages.get(seq)
            if m is not None and m.copy_of is not None:
                m = R.resolve_copy(m, self.message(m.copy_of))
        self.last_content = (seq, m)
        return m

    def claim(self, sub_id: str, queue: str, consumer: str, limit: int, lease_ms: int, now_ms: int, *,
              destructive: bool = False, filter: str | None = None, consumer_name: str = "") -> None:
        self.subscriptions.claim(sub_id, queue, consumer, limit, lease_ms, now_ms, destructive=destructive,
                                 filter=filter, consumer_name=consumer_name)

    def end_claim(self, sub_id: str) -> None:
        self.subscriptions.end_claim(sub_id)

    def sub(self, sub_id: str) -> Subscription:
        # The settles below find their subscription here, not in the part: one place to
        # change how a settle finds its queue (the simulator plants a bug in this one).
        return self.subscriptions.sub(sub_id)

    def unsubscribe(self, sub_id: str, now_ms: int, detached: bool = False) -> None:
        self.subscriptions.unsubscribe(sub_id, now_ms, detached)

    def disconnect(self, consumer: str, now_ms: int) -> None:
        self.subscriptions.disconnect(consumer, now_ms)

    # ------------------------------------------------------------------ settles

    def ack(self, sub_id: str, seqs: Iterable[int], now_ms: int, epochs: list[int] | None = None,
            stale: list[int] | None = None) -> list[int]:
        """Acknowledge; returns the bookmarks refused (not leased by this subscription).
        ``epochs``: fenced (``settle``); seqs of a delivery no longer live go to ``stale``."""
        self.set_time(now_ms)
        sub = self.sub(sub_id)
        q = sub.queue
        now = self.now_ms
        seqs = seqs if isinstance(seqs, list) else list(seqs)
        fenced_off: list[int] = []
        refused = q.ack_many(sub, seqs, now, epochs, fenced_off)
        if fenced_off:
            if stale is not None:
                stale.extend(fenced_off)
            off = set(fenced_off)
            seqs = [seq for seq in seqs if seq not in off]
        if refused:
            gone = set(refused)
            seqs = [seq for seq in seqs if seq not in gone]
            if q.target.inactive:
                refused = [seq for seq in refused if not self.ack_inactive(q, sub, seq)]
        self.times.count_acks(q, seqs, now, self.next_seq)  # publish -> ack latencies
        return refused

    def settle(self, op: str, sub_id: str, seqs: list[int], epochs: list[int] | None, now_ms: int,
               extra_ms: int = 0, delay_ms: int = -1, error: str = "") -> dict[str, list[int]]:
        """Ack, cancel, expire or extend (``extra_ms``) with fencing: each bookmark's
        ``epochs`` entry is the delivery count it was delivered with, and a settle
        naming a delivery that is no longer live is not applied. Returns the bookmarks
        not applied by result (``lost``, ``done``, ``dead``, ``unknown``: ``settling.settle_result``);
        the rest were applied (``ok``). ``epochs`` None or empty: unfenced."""
        sub = self.sub(sub_id)
        q = sub.queue
        stale: list[int] = []
        if epochs and len(epochs) != len(seqs):
            raise ProtocolError(f"{len(epochs)} epochs for {len(seqs)} bookmarks")
        if op == "ack":  # the hot one: fenced in the same pass as the acks
            refused = self.ack(sub_id, seqs, now_ms, epochs or None, stale)
        else:
            if op not in ("cancel", "expire", "extend"):
                raise ProtocolError(f"no settle {op!r}")
            if epochs:
                seqs, stale = q.fence(sub, seqs, epochs)
            if op == "cancel":
                refused = self.cancel(sub_id, seqs, now_ms, delay_ms, error)
            elif op == "expire":
                refused = self.expire(sub_id, seqs, now_ms)
            else:
                refused = self.extend(sub_id, seqs, extra_ms, now_ms)
        results: dict[str, list[int]] = {}
        if stale:
            results["lost"] = stale
        for seq in refused:
            results.setdefault(q.settle_result(seq, self.next_seq), []).append(seq)
        lost = results.get("lost")
        if lost:
            q.lost_settles += len(lost)
        return results

    def transact(self, sub_id: str, op: str, seqs: list[int], epochs: list[int],
                 outputs: list[tuple[str, list[tuple[bytes, dict[str, str], str | None]]]], now_ms: int,
                 max_message_bytes: int = limits.MESSAGE_BYTES_MAX, delay_ms: int = -1,
                 error: str = "") -> tuple[dict[str, list[int]], list[list[int]]]:
        """Settle and publish, all or nothing (``zq.core.transactions``)."""
        return transactions.transact(self, sub_id, op, seqs, epochs, outputs, now_ms, max_message_bytes, delay_ms,
                                     error)

    def release_revoked(self, sub_id: str, seqs: list[int], epochs: list[int], kept: list[int],
                        kept_epochs: list[int], now_ms: int) -> int:
        """A reclaimable subscription's answer to a revoke: ``seqs`` (delivered with
        ``epochs``) were not started and come back, no delivery counted; ``kept`` (with
        ``kept_epochs``) were started. Returns how many came back (``Reclaimer.take_back``)."""
        self.set_time(now_ms)
        sub = self.sub(sub_id)
        if not sub.reclaimable:
            raise ProtocolError(f"subscription {sub_id.rpartition('/')[2]!r} is not reclaimable")
        if len(epochs) != len(seqs) or len(kept_epochs) != len(kept):
            raise ProtocolError(f"{len(epochs)} epochs for {len(seqs)} bookmarks, {len(kept_epochs)} for {len(kept)} kept")
        return len(sub.queue.reclaiming.take_back(sub, seqs, epochs, kept, kept_epochs))

    def cancel(self, sub_id: str, seqs: Iterable[int], now_ms: int, delay_ms: int = -1, error: str = "") -> list[int]:
        """Cancel deliveries: each message goes again after the queue's retry schedule,
        or after ``delay_ms`` (0: at once; -1: the schedule). With ``error`` (why the
        work failed) the deliveries count as failed (``max_failures``)."""
        self.set_time(now_ms)
        if not -1 <= delay_ms <= limits.DURATION_MS_MAX:
            raise ProtocolError(f"a cancel's delay must be 0..{limits.DURATION_MS_MAX} ms (-1: the queue's backoff)")
        if len(error) > limits.ERROR_TEXT_MAX:
            raise ProtocolError(f"a cancel's error is at most {limits.ERROR_TEXT_MAX} characters")
        sub = self.sub(sub_id)
        now = self.now_ms
        return [seq for seq in seqs if sub.queue.cancel(sub, seq, now, delay_ms, error) is not None]

    def expire(self, sub_id: str, seqs: Iterable[int], now_ms: int) -> list[int]:
        self.set_time(now_ms)
        sub = self.sub(sub_id)
        return [seq for seq in seqs if sub.queue.expire_request(sub, seq) is not None]

    def extend(self, sub_id: str, seqs: list[int], extra_ms: int, now_ms: int) -> list[int]:
        """Lease the given messages for ``extra_ms`` from now; returns those refused."""
        self.set_time(now_ms)
        if not 0 < extra_ms <= limits.DURATION_MS_MAX:
            raise ProtocolError(f"a lease extension must be 1..{limits.DURATION_MS_MAX} ms")
        sub = self.sub(sub_id)
        return sub.queue.extend(sub, seqs, now_ms + extra_ms)

    # ------------------------------------------------------------ time passing

    def advance(self, now_ms: int) -> None:
        """Time passed: expire leases that ended and messages too old to keep, in the
        queues whose deadline came and those touched this step."""
        self.set_time(now_ms)
        now = self.now_ms
        heap = self.deadlines
        while heap and heap[0][0] <= now:
            when, _, q = heapq.heappop(heap)
            if q.scheduled_ms == when:  # (else a stale entry: a sooner one replaced it)
                q.scheduled_ms = -1
                if self.queues.get(q.name) is q:
                    self.touch(q)
        if self.visit_all:
            for q in self.queues.values():
                self.touch(q)
        self.advanced_ms = now
        for q in self.visiting():
            q.advanced_ms = now
            q.advance(now, self.watermark(q))

    def next_deadline_ms(self) -> int | None:
        """When ``advance`` next has work (a lease ends or a message ages out, or a
        target-depth refill is part way through its scan)."""
        best = None
        for q in self.touched:  # (after a drain: only those with work left, or touched since)
            if self.queues.get(q.name) is not q:
                continue
            if q.target.scanning or q.out_of_budget:
                return self.now_ms
            d = self.deadline_of(q)
            if d is not None and (best is None or d < best):
                best = d
        heap = self.deadlines
        while heap and (heap[0][2].scheduled_ms != heap[0][0] or self.queues.get(heap[0][2].name) is not heap[0][2]):
            heapq.heappop(heap)  # stale: replaced by a sooner entry, or its queue is gone
        if heap and (best is None or heap[0][0] < best):
            best = heap[0][0]
        return best

    # ------------------------------------------------------------------ drain

    def drain(self, now_ms: int) -> Output:
        """Dispatch everything possible; return what to journal, then what to send."""
        self.set_time(now_ms)
        now = self.now_ms
        if self.visit_all:
            for q in self.queues.values():
                self.touch(q)
        self.visit_touched(now)
        touched = self.visiting()
        outputs = self.outputs
        for q in touched:
            if q.reclaiming.subs:
                outputs.plan_revokes(q)
            outputs.flush_events(q)
            if q.ledger.done:  # its dead letters, which read it, are published by now
                q.ledger.done = {}
            if q.reclaiming.done:
                q.reclaiming.done = {}
        self.send(touched, now)
        self.points.write_if_due(now)
        self.admission.check_overflow_ends()
        if self.names_to_forget:
            for consumer in self.names_to_forget:
                if consumer not in self.subscriptions.subs_of_consumer:
                    self.consumer_names.pop(consumer, None)
            self.names_to_forget = []
        self.leave(self.visiting())
        out = Output(self.records, self.deliveries, outputs.take_revokes())
        self.records, self.deliveries = [], []
        self.step_messages = None
        self.last_content = (-1, None)
        self.admission.end_step()
        return out

    def visit_touched(self, now: int) -> None:
        """Dispatch the queues to visit, in the order they were made, until nothing moves:
        an expiry's dead letters enter other queues, which are visited in the same pass
        when later in the order, in another pass otherwise."""
        budget = self.dispatch_budget  # filter evaluations, all queues: the rest waits a step
        outputs = self.outputs
        for _ in range(64):  # dead letters can feed other queues; bounded, converges fast
            busy = False
            order = list(self.visiting())
            known = len(self.touched)
            i = 0
            while i < len(order):
                q = order[i]
                i += 1
                if q.target.inactive and q.active() < q.target.limit:
                    self.refill(q)
                if q.dirty:
                    if budget > 0 or not q.filtered:
                        budget -= q.dispatch(now, max(budget, 0))
                    else:
                        q.out_of_budget = True  # (its turn comes at the next step)
                    if q.out_of_budget:
                        self.dispatch_deferred += 1
                if q.reclaiming.holding:  # reclaimed messages were offered to the others: their holders may take more
                    q.reclaiming.end_hold()
                outputs.flush_events(q)  # causes (cancelled, returned) before their expiries
                if q.expired_out:
                    outputs.flush_expired(q)
                    busy = True
                if len(self.touched) > known:  # dead letters entered other queues: those later in
                    for t in self.touched[known:]:  # the order are visited in this pass, the others next
                        if t.ordinal > q.ordinal and self.queues.get(t.name) is t:
                            insort(order, t, lo=i, key=ordinal_of)
                    known = len(self.touched)
            if not busy and not any(q.dirty and not q.out_of_budget for q in self.touched):
                break

    def send(self, touched: list[Queue], now: int) -> None:
        """This step's deliveries, in the order the subscriptions were made, across queues;
        each lease journaled (``leased``) before it is sent."""
        sending = [sub for q in touched for sub in q.subs if sub.out_seqs or sub.barrier_out]
        if len(sending) > 1:
            sending.sort(key=sub_ordinal_of)  # in the order they subscribed, across queues
        for sub in sending:
            if sub.barrier_out:  # before anything later in the same step
                seqs, sub.barrier_out = sub.barrier_out, []
                self.deliveries.append(Deliver(sub.sub_id, sub.queue.name, seqs, [0] * len(seqs)))
            if sub.out_seqs:
                seqs, deliveries = sub.queue.take_outbox(sub)
                if not sub.queue.browse:  # browsing leases nothing: no event
                    self.records.append(R.Event(self.take_seq(), now, R.LEASED, sub.queue.name, sub.consumer, seqs,
                                                deliveries, "", self.consumer_names.get(sub.consumer, "")))
                self.deliveries.append(Deliver(sub.sub_id, sub.queue.name, seqs, deliveries))
                if sub.destructive:
                    self.ack(sub.sub_id, seqs, now)  # a destructive claim: gone before it is sent
                    self.outputs.flush_events(sub.queue)

    def leave(self, visited: list[Queue]) -> None:
        """The end of a step's visit: each queue's next deadline goes in the heap; those
        with work left (a dispatch or refill stopped at its budget, a refill waiting for
        its messages' commit) stay touched for the next step."""
        left: list[Queue] = []
        for q in visited:
            self.schedule(q)
            self.points.visit(q)  # (one carried from step to step is not touched again)
            if q.out_of_budget or q.target.scanning or (q.target.inactive and q.active() < q.target.limit):
                left.append(q)
            else:
                q.touched = False
        self.touched = left

    # ---------------------------------------- recovery points (zq.core.recovery)

    def write_recovery_points(self) -> None:
        self.points.write()

    def min_recovery_point(self) -> int:
        return self.points.lowest()

    # ----------------------------------------------------- views (zq.core.views)

    def stats(self, names: list[str] | None = None, limit: int = 0,
              sees: Callable[[str], bool] | None = None) -> dict[str, Any]:
        return self.views.stats(names, limit, sees)

    def peek(self, queue: str, limit: int, filter: str | None = None) -> list[tuple[int, int]]:
        return self.views.peek(queue, limit, filter)

    def query(self, queue: str, group_by: list[str], aggregates: list[str], filter: str | None = None) -> dict[str, Any]:
        return self.views.query(queue, group_by, aggregates, filter)

    # ------------------------------------------------------------- recovery

    @classmethod
    def recover(
        cls,
        queues: Iterable[QueueSettings],
        declared: Iterable[R.QueueDeclared],
        recovery_points: dict[str, int],
        next_seq: int,
        events: Iterable[R.Event],
        messages: Iterable[R.Message],
        *,
        auto_queues: bool = True,
        content: Callable[[int], R.Message | None] | None = None,
        find_id: Callable[[str, str], tuple[int, int] | None] | None = None,
        scan: Callable[[int, int], list[R.Message]] | None = None,
    ) -> "Engine":
        """Rebuild every queue from the journal (a pure fold over its records).

        ``events`` and ``messages`` are the journal's records at or above
        ``min(recovery_points)`` (or of everything, for queues without one), each in
        sequence order. Acked and expired messages are gone; every other message
        returns to its queue in its original order with its delivery and cancel counts.
        """
        eng = cls(queues, auto_queues=auto_queues, next_seq=next_seq, content=content, find_id=find_id, scan=scan)
        load_declared(eng, declared)
        replay = Replay(eng, eng.routes, eng.times)
        replay.fold_events(events)
        replay.replay(messages, recovery_points)
        replay.finish(recovery_points, eng.points.written)
        return eng
