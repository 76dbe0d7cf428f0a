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

One global counter numbers messages and events alike (``records`` explains why).
Recovery is a pure fold: ``Engine.recover`` reads the records at or above the lowest
recovery point and rebuilds every queue. The engine has no clock, no socket, no
disk and no randomness; ``zq.testing.simulator`` drives it from a seed.
"""

from __future__ import annotations

import heapq
from array import array
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from zq.core import expr, limits
from zq.core import records as R
from zq.core.errors import (
    ConfigError,
    LimitError,
    NotSupportedError,
    ProtocolError,
    QueueFullError,
    ReservedNameError,
    UnknownQueueError,
    UnknownSubscriptionError,
    ZqError,
)
from zq.core.depth import TargetDepthMixin
from zq.core.effects import Deliver, Output, Revoke  # noqa: F401 -- also zq.core.engine's: where they were
from zq.core.manage import ManagementMixin
from zq.core.query import Query
from zq.core.queue import Queue, Subscription
from zq.core.settings import (
    DEDUP_WINDOW_MS_DEFAULT,
    QueueSettings,
    auto_queue,
    check_queue_name,
    check_topic,
    covers_topic,
)


# Publish -> ack latency histogram bucket upper bounds (ms); the last bucket is +Inf.
ACK_LATENCY_BUCKETS_MS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10_000, 30_000, 60_000)


def ordinal_of(q: Queue) -> int:
    return q.ordinal


def sub_ordinal_of(sub: Subscription) -> int:
    return sub.ordinal


def held_count(q: Queue) -> int:
    return q.depth + len(q.lease_of)


class Engine(ManagementMixin, TargetDepthMixin):
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
        # The dedup port: (topic, message id) -> (bookmark, publish ms) of its first
        # journaled publish. This step's ids are not journaled yet: ``step_ids``.
        self.find_id = find_id
        self.step_ids: dict[tuple[str, str], tuple[int, int]] = {}
        self.duplicates = 0
        # Filter evaluations one drain may make, all queues (the simulator lowers it to
        # exercise the stop-and-go-on path in every fault it injects).
        self.dispatch_budget = limits.DISPATCH_MATCHES_PER_STEP
        self.dispatch_deferred = 0  # queue dispatches left for the next step at that budget (STATS)
        self.notices: list[str] = []  # operator-worthy changes (overflow breaches); the adapter logs them
        self.over_limit: set[str] = set()  # queues in an overflow breach (checked each drain)
        # The content port: reads a journaled message by bookmark (filters need it).
        # Messages of the current step are not journaled yet; ``message`` finds those
        # in ``records``.
        self.content = content
        self.step_messages: dict[int, R.Message] | None = None
        self.step_indexed = 0
        self.last_content: tuple[int, R.Message | None] = (-1, None)
        self.auto_queues = auto_queues
        # Queues a subscription created (a consumer of a name no queue has): not journaled
        # until a message enters one (``route_or_create``), and forgotten when their last
        # subscription ends with nothing in them. A typo (`zq consume jbos`) leaves nothing behind.
        self.provisional: set[str] = set()
        self.next_seq = next_seq
        self.subs: dict[str, Subscription] = {}
        self.subs_of_consumer: dict[str, set[str]] = {}
        # What consumers called themselves (HELLO): written into their events, so the
        # journal's history names them; dropped once a gone consumer's last events are out.
        self.consumer_names: dict[str, str] = {}
        self.names_to_forget: list[str] = []
        self.route_cache: dict[str, list[Queue]] = {}
        self.records: list[Any] = []
        self.deliveries: list[Deliver] = []
        self.revokes: list[Revoke] = []
        self.now_ms = 0
        self.ti_ms = array("q")  # time index: first seq published at each ms
        self.ti_seq = array("Q")
        self.rp_written: dict[str, int] = {}
        self.rp_due_ms = 0
        self.rp_visited: list[Queue] = []  # queues visited since the recovery points were last written
        self.rp_ring: list[Queue] = []  # every queue, in turn: a slice of them each interval
        self.rp_ring_at = 0
        self.rp_ring_made = -1  # ``queues_made`` when the ring was built
        self.published = 0
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
        self.subs_made = 0
        self.advanced_ms = 0  # the time of the last ``advance``: an idle queue's expiry watermark is as of then
        # Tests: visit every queue every step (how each step went before ``touch``), to
        # compare traces with; never set in service.
        self.visit_all = False
        for settings in queues:
            self.add_queue(settings.validate(), declare=False)
        for q in self.queues.values():
            if q.settings.dead_letter is not None:
                self.check_dead_letter(q.settings.dead_letter, q.name)

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
        self.route_cache.clear()
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
        if not q.rp_pending:
            q.rp_pending = True
            self.rp_visited.append(q)
        if q.advanced_ms != self.advanced_ms:
            q.expired_watermark = self.watermark_at(q, self.advanced_ms)

    def deadline_of(self, q: Queue) -> int | None:
        """``q``'s next deadline: a lease's end, a delayed message, an age limit or sweep."""
        d = q.next_deadline_ms()
        e = self.next_expiry_ms(q)
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

    def route(self, topic: str) -> list[Queue]:
        qs = self.route_cache.get(topic)
        if qs is None:
            qs = [q for q in self.queues.values() if q.covers(topic)]
            self.route_cache[topic] = qs
        return qs

    def route_or_create(self, topic: str, *, dead_letter: bool = True, strict: bool = True) -> list[Queue]:
        """The queues covering ``topic``; with none, an auto-created queue of that name.

        A queue's name is reserved: when no queue covers ``topic`` but a queue is named
        so (its ``topics`` take other names), a message there would reach no queue, or
        an auto-created queue would take the name. ``strict`` (a publish, a move) refuses
        it before anything is journaled; a copy that must go somewhere (a dead letter, a
        redrive) is journaled on its topic in no queue, and a notice says so.
        """
        queues = self.route(topic)
        if self.provisional:
            for q in queues:
                if q.name in self.provisional:
                    self.keep_provisional(q)
        if not queues:
            named = self.queues.get(topic)
            if named is not None:
                text = (f"{topic!r} is the name of queue {topic!r}, which takes the topics matching "
                        f"{named.settings.topics!r}, not {topic!r}")
                if strict:
                    raise ReservedNameError(f"{text}: publish to one of its topics (or give the queue publish_to)")
                self.notices.append(f"a copy published to {text}: it is in the journal, in no queue")
            elif self.auto_queues:
                queues = [self.add_queue(self.auto_settings(topic, dead_letter))]
                self.route_cache.pop(topic, None)
        return queues

    def auto_settings(self, name: str, dead_letter: bool = True) -> QueueSettings:
        """An auto-created queue's settings: the defaults of every queue, except a dead
        letter that would reach no queue (``<name>.dead`` is the name of a queue whose
        topics do not take it): then none, said in the log."""
        s = auto_queue(name, self.next_seq, dead_letter=dead_letter)
        target = s.dead_letter
        if target is not None and target in self.queues and not self.route(target):
            self.notices.append(f"queue {name[:80]!r} created without a dead letter: {target[:80]!r} is the name of a "
                                "queue whose topics do not take it, so its dead letters would reach no queue")
            s = msgspec.structs.replace(s, dead_letter=None)
        return s

    def keep_provisional(self, q: Queue) -> None:
        """A queue a subscription created gets its first message (or a declare, an alter):
        journaled from now on, as if declared (its start stays where it began)."""
        self.provisional.discard(q.name)
        self.records.append(R.QueueDeclared(msgspec.json.encode(q.settings), self.now_ms))
        self.tables_changes += 1

    def forget_provisional(self, q: Queue) -> None:
        """A queue a subscription created, never given a message, loses its last subscriber."""
        if q.name in self.provisional and not q.subs and q.depth == 0 and not q.lease_of and not q.meta:
            self.provisional.discard(q.name)
            del self.queues[q.name]
            self.route_cache.clear()

    def check_dead_letter(self, target: str, source: str, new: QueueSettings | None = None) -> None:
        """Refuse a dead-letter target that names a queue not taking it as a topic: its
        dead letters would reach no queue. ``new``: a queue about to be declared."""
        named = new if new is not None and new.name == target else (q.settings if (q := self.queues.get(target)) else None)
        if named is None or self.route(target) or new is not None and covers_topic(new, target):
            return
        raise ConfigError(f"queue {source!r}: dead_letter {target!r} is the name of queue {target!r}, whose topics "
                          f"({named.topics!r}) do not include {target!r}: its dead letters would reach no queue")

    def resolve_topic(self, topic: str) -> str:
        q = self.queues.get(topic)
        if q is not None and q.settings.publish_to:
            return q.settings.publish_to
        return topic

    # ------------------------------------------------------------ publish

    def publish(
        self,
        topic: str,
        payload: bytes,
        headers: dict[str, str] | None,
        now_ms: int,
        msg_id: str | None = None,
        not_before_ms: int = 0,
    ) -> int:
        """Journal one message and enqueue it on every queue covering its topic.

        Returns its bookmark. Raises ProtocolError / LimitError for a bad message,
        before anything is journaled. (A batch of one: see ``publish_many``.)
        """
        return self.publish_many(topic, [(payload, headers or {}, msg_id)], now_ms,
                                 not_before_ms=not_before_ms)[0]

    def publish_many(
        self,
        topic: str,
        items: list[tuple[bytes, dict[str, str], str | None]],
        now_ms: int,
        max_message_bytes: int = limits.MESSAGE_BYTES_MAX,
        not_before_ms: int = 0,
    ) -> list[int]:
        """Publish a batch atomically: every message is checked before any is journaled.

        Topic resolution, routing and the group-ceiling check happen once per batch.
        ``not_before_ms`` (Unix ms): no message of the batch goes before then.
        """
        self.set_time(now_ms)
        if not 0 <= not_before_ms <= self.now_ms + limits.DURATION_MS_MAX:
            raise ProtocolError("a publish's not-before time must be 0..100 years from now")
        due = not_before_ms if not_before_ms > self.now_ms else 0
        topic = self.resolve_topic(topic)
        check_topic(topic)
        max_bytes = min(max_message_bytes, limits.MESSAGE_BYTES_MAX)
        for payload, headers, msg_id in items:
            if len(payload) > max_bytes:
                raise LimitError(f"message of {len(payload)} bytes exceeds max_message_size {max_bytes}")
            if headers:
                check_headers(headers)
            if msg_id is not None and len(msg_id) > limits.HEADER_BYTES_MAX:
                raise LimitError(f"message id longer than {limits.HEADER_BYTES_MAX}")
        queues = self.route_or_create(topic)
        known: dict[int, int] = {}  # index in items -> bookmark of its first publish
        if any(msg_id is not None for _, _, msg_id in items):
            known = self.seen_ids(topic, items, queues, now_ms)
            if known:
                fresh = [it for i, it in enumerate(items) if i not in known]
                seqs = self.publish_fresh(topic, fresh, queues, now_ms, due) if fresh else []
                out, it = [], iter(seqs)
                for i in range(len(items)):
                    out.append(known[i] if i in known else next(it))
                return out
        return self.publish_fresh(topic, items, queues, now_ms, due)

    def seen_ids(self, topic: str, items: list[tuple[bytes, dict[str, str], str | None]], queues: list[Queue],
                 now_ms: int) -> dict[int, int]:
        """Items whose message id was published to ``topic`` within the dedup window."""
        window = max((q.settings.dedup_window_ms for q in queues), default=DEDUP_WINDOW_MS_DEFAULT)
        if not window:
            return {}
        known: dict[int, int] = {}
        batch: dict[str, int] = {}
        for i, (_, _, msg_id) in enumerate(items):
            if msg_id is None:
                continue
            if msg_id in batch:
                known[i] = -1 - batch[msg_id]  # the same id earlier in this batch: resolved below
                continue
            hit = self.step_ids.get((topic, msg_id))
            if hit is None and self.find_id is not None:
                hit = self.find_id(topic, msg_id)
            if hit is not None and hit[1] >= now_ms - window:
                known[i] = hit[0]
            else:
                batch[msg_id] = i
        if known:
            self.duplicates += len(known)
            # Repeats inside the batch get the bookmark their first occurrence will get.
            order = [i for i in range(len(items)) if i not in known]
            first = self.next_seq
            for i, v in list(known.items()):
                if v < 0:
                    known[i] = first + order.index(-1 - v)
        return known

    def publish_fresh(self, topic: str, items: list[tuple[bytes, dict[str, str], str | None]], queues: list[Queue],
                      now_ms: int, due: int = 0) -> list[int]:
        named: dict[str, bool] = {}  # group header -> does any item carry it?
        for q in queues:
            if q.overflow.limited and q.settings.overflow == "reject":
                self.check_room(q, topic, items)
            if q.grouped:
                header = q.settings.group_header
                names = {h[header] for _, h, _ in items if header in h}  # type: ignore[index]
                named[header] = bool(names)  # type: ignore[index]
                fresh = [n for n in names if n not in q.gid_of]
                if len(q.groups) + len(fresh) > q.settings.max_groups:
                    raise LimitError(f"queue {q.name!r} reached max_groups={q.settings.max_groups}")
        first = self.next_seq
        self.next_seq += len(items)
        self.note_time(now_ms, first)
        append = self.records.append
        message = R.Message
        for i, (payload, headers, msg_id) in enumerate(items):
            append(message(first + i, now_ms, topic, headers, payload, msg_id))
            if msg_id is not None:
                self.step_ids[(topic, msg_id)] = (first + i, now_ms)
        for q in queues:
            self.touch(q)
            accept = q.filter
            if q.barrier.fn is not None or q.ordered or q.tqd or due or q.last_values.fn is not None:
                self.enqueue_each(q, topic, items, first, due)
            elif q.grouped and accept is None and not named[q.settings.group_header]:  # type: ignore[index]
                q.enqueue_run(first, len(items))  # no message of the batch names a group
            elif q.grouped:
                header = q.settings.group_header
                for i, (payload, headers, _) in enumerate(items):
                    if accept is not None and not accept(headers, payload, topic):
                        continue
                    name = headers.get(header)  # type: ignore[arg-type]
                    q.enqueue(first + i, q.group_id(name) if name is not None else 0)
            elif accept is not None:
                for i, (payload, headers, _) in enumerate(items):
                    if accept(headers, payload, topic):
                        q.enqueue(first + i, 0)
            else:
                q.enqueue_run(first, len(items))
            if q.overflow.limited:
                self.after_enqueue_limited(q, topic, items, first)
        self.published += len(items)
        return list(range(first, first + len(items)))

    def enqueue_each(self, q: Queue, topic: str, items: list[tuple[bytes, dict[str, str], str | None]],
                     first: int, due: int = 0) -> None:
        """Enqueue one by one on a queue that judges each message (barrier, priority, sort
        key, last value, target depth), or when they are delayed (``due``: Unix ms)."""
        accept, header = q.filter, q.settings.group_header
        for i, (payload, headers, _) in enumerate(items):
            if accept is not None and not accept(headers, payload, topic):
                continue
            self.enqueue_one(q, first + i, headers, payload, topic, header, due)

    def enqueue_one(self, q: Queue, seq: int, headers: dict[str, str], payload: bytes, topic: str,
                    header: str | None, due: int = 0) -> None:
        if q.tqd and not q.admit(seq):
            if due:  # journaled below; kept here until the message is read back in
                q.inactive_due[seq] = due
                q.delays_out.append((seq, 0, due, R.DELAY_PUBLISHED))
            return  # journal-only for now: read back as the queue drains
        level, key = 0, None
        if q.ordered or q.last_values.fn is not None:
            judged = q.judge(seq, headers, payload, topic)
            if judged is None:
                return  # poison: set aside, dead-lettered when this step drains
            level, key = judged
        if q.barrier.fn is not None and q.barrier.fn(headers, payload, topic):
            q.enqueue(seq, 0)
            q.barrier.waiting.append(seq)  # a barrier goes when everything before it is acked: a delay has no meaning
        else:
            name = headers.get(header) if q.grouped and header else None  # type: ignore[arg-type]
            gid = q.group_id(name) if name is not None else 0
            q.enqueue(seq, gid, level)
            if due and not q.browse:  # browsers see every message at once: nothing is leased
                q.mark_delayed(seq, gid, due, R.DELAY_PUBLISHED)
        if key is not None:
            q.last_values.admit(seq, key)

    def check_room(self, q: Queue, topic: str, items: list[tuple[bytes, dict[str, str], str | None]]) -> None:
        """overflow = "reject": refuse the whole batch before anything is journaled."""
        entering = [p for p, h, _ in items if q.filter is None or q.filter(h, p, topic)]
        if entering and q.overflow.would_overflow(len(entering), sum(map(len, entering))):
            q.overflow.rejected += len(entering)
            if not q.overflow.blocked:
                q.overflow.blocked = True
                q.overflow.breaches += 1
                self.over_limit.add(q.name)
                self.notices.append(f"queue {q.name!r} is full: publishes are refused (overflow = reject)")
            s = q.settings
            raise QueueFullError(f"queue {q.name!r} is full ({q.held()} messages of max_depth {s.max_depth or '-'}, "
                                 f"{q.overflow.bytes} bytes of max_bytes {s.max_bytes or '-'}; overflow = reject)")

    def after_enqueue_limited(self, q: Queue, topic: str, items: list[tuple[bytes, dict[str, str], str | None]],
                              first: int) -> None:
        if q.overflow.sizes is not None:
            for i, (payload, headers, _) in enumerate(items):
                if q.filter is None or q.filter(headers, payload, topic):
                    q.overflow.sizes[first + i] = len(payload)
                    q.overflow.bytes += len(payload)
        if not q.overflow.over():
            return
        if not q.overflow.blocked:
            q.overflow.blocked = True
            q.overflow.breaches += 1
            self.over_limit.add(q.name)
            action = {"ring": "the oldest are dropped", "flow-control": "confirmations are withheld"}.get(
                q.settings.overflow, "publishes are refused")
            self.notices.append(f"queue {q.name!r} reached its limit: {action}")
        if q.settings.overflow == "ring":
            q.overflow.make_room()

    def enqueue_copy(self, q: Queue, seq: int, gid: int) -> None:
        """A copy (dead letter, move, redrive) enters ``q``: it is never refused, but it
        counts toward the queue's limits (ring queues make room)."""
        self.touch(q)
        if q.tqd and not q.admit(seq):
            return  # journal-only for now: read back as the queue drains
        level, key = 0, None
        if q.ordered or q.last_values.fn is not None:
            m = self.message(seq)
            if m is not None:
                judged = q.judge(seq, m.headers, m.payload, m.topic)
                if judged is None:
                    return  # poison: set aside, dead-lettered when this step drains
                level, key = judged
        if q.barrier.fn is not None:
            m = self.message(seq)
            if m is not None and q.barrier.fn(m.headers, m.payload, m.topic):
                gid = 0
                q.barrier.waiting.append(seq)
        q.enqueue(seq, gid, level)
        if key is not None:
            q.last_values.admit(seq, key)
        if q.overflow.limited:
            if q.overflow.sizes is not None:
                m = self.message(seq)
                size = len(m.payload) if m is not None else 0
                q.overflow.sizes[seq] = size
                q.overflow.bytes += size
            if q.overflow.over() and q.settings.overflow == "ring":
                q.overflow.make_room()

    def check_overflow_ends(self) -> None:
        """A breach ends when the queue is back under its limits (flow-control: under
        ``resume_percent`` of them); logged once, like its start."""
        for name in list(self.over_limit):
            q = self.queues.get(name)
            if q is None:  # deleted
                self.over_limit.discard(name)
                continue
            percent = q.settings.resume_percent if q.settings.overflow == "flow-control" else 100
            if not q.overflow.over(percent):
                q.overflow.blocked = False
                self.over_limit.discard(name)
                self.notices.append(f"queue {q.name!r} is back under its limits")

    def withheld(self, topic: str) -> list[str]:
        """Flow-control queues over their limits among those ``topic`` feeds: a publish
        confirmation waits until they are not (the adapter holds it)."""
        return [q.name for q in self.route(self.resolve_topic(topic)) if q.overflow.blocked and q.settings.overflow == "flow-control"]

    def take_seq(self) -> int:
        seq = self.next_seq
        self.next_seq += 1
        return seq

    def set_time(self, now_ms: int) -> None:
        if now_ms > self.now_ms:
            self.now_ms = now_ms

    def note_time(self, now_ms: int, seq: int) -> None:
        if not self.ti_ms or now_ms > self.ti_ms[-1]:
            self.ti_ms.append(now_ms)
            self.ti_seq.append(seq)

    def watermark(self, q: Queue) -> int:
        """Highest seq published at or before now - expiration (-1: none expired)."""
        return self.watermark_at(q, self.now_ms)

    def watermark_at(self, q: Queue, at_ms: int) -> int:
        e = q.settings.expiration_ms
        if not e or not self.ti_ms:
            return -1
        i = bisect_right(self.ti_ms, at_ms - e)
        if i == 0:
            return -1
        return self.ti_seq[i] - 1 if i < len(self.ti_seq) else self.next_seq - 1

    # ------------------------------------------------------ subscriptions

    def subscribe(
        self, sub_id: str, queue: str, consumer: str, max_backlog: int, now_ms: int, filter: str | None = None,
        consumer_name: str = "", reclaimable: bool = False,
    ) -> int:
        """Open a subscription; returns its backlog (the credit it gets).

        With ``filter`` (the expression language), the subscription gets only the
        messages it matches, oldest first; the others wait for other subscribers.
        ``reclaimable``: deliveries it has not started may be asked back for a hungry
        subscription (``Queue.plan_revokes``; the holder answers with ``release_revoked``).
        """
        self.set_time(now_ms)
        check_queue_name(queue)
        match = None
        if filter:
            match = self.matcher(expr.compile_filter(filter, self.expr_limits))
        if sub_id in self.subs:
            raise ProtocolError(f"subscription id {sub_id!r} is already in use")
        if len(self.subs) >= limits.SUBSCRIPTIONS_MAX:
            raise LimitError(f"too many subscriptions (max {limits.SUBSCRIPTIONS_MAX})")
        q = self.queues.get(queue)
        if q is None:
            if not self.auto_queues:
                raise UnknownQueueError(f"no queue named {queue!r}")
            covering = self.route(queue)
            if covering:  # a second queue would get each of these messages too: twice the work
                first = covering[0]
                raise UnknownQueueError(
                    f"no queue named {queue!r}: messages on topic {queue!r} go to queue {first.name!r} (its topics "
                    f"{first.settings.topics!r}); consume {first.name!r} (a filter picks some of them), or create "
                    f"queue {queue!r} explicitly to have a second queue that gets every one of them as well")
            if max_backlog < 1:
                raise ProtocolError(f"max_backlog must be at least 1, got {max_backlog}")
            q = self.add_queue(self.auto_settings(queue), declare=False)
            self.provisional.add(queue)
        if max_backlog < 1:
            raise ProtocolError(f"max_backlog must be at least 1, got {max_backlog}")
        if reclaimable and (q.at_most_once or q.browse):
            raise ProtocolError(f"queue {queue!r} is {'browse-only' if q.browse else 'at-most-once'}: its deliveries "
                                "cannot be taken back (reclaimable needs an at-least-once queue)")
        backlog = min(q.settings.max_per_subscription_backlog, max_backlog)
        sub = Subscription(sub_id, q, consumer, backlog, match, filter or None)
        self.subs_made += 1
        sub.ordinal = self.subs_made
        sub.reclaimable = reclaimable
        self.touch(q)
        self.subs[sub_id] = sub
        self.subs_of_consumer.setdefault(consumer, set()).add(sub_id)
        if consumer_name:
            self.consumer_names[consumer] = consumer_name
        q.add_subscription(sub)
        return backlog

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

    def claim(
        self,
        sub_id: str,
        queue: str,
        consumer: str,
        limit: int,
        lease_ms: int,
        now_ms: int,
        *,
        destructive: bool = False,
        filter: str | None = None,
        consumer_name: str = "",
    ) -> None:
        """Open a claim (Marconi): up to ``limit`` messages leased for ``lease_ms``.

        The claim's deliveries come out of ``drain`` like any subscription's; the
        adapter ends the claim (``end_claim``) once it has answered. A ``destructive``
        claim removes what it takes (acked in the same step: an at-most-once batch get).
        """
        self.set_time(now_ms)
        if not 1 <= limit <= limits.CLAIM_MAX:
            raise ProtocolError(f"claim limit must be 1..{limits.CLAIM_MAX}, got {limit}")
        if not 0 < lease_ms <= limits.DURATION_MS_MAX:
            raise ProtocolError(f"a claim's lease must be 1..{limits.DURATION_MS_MAX} ms")
        match = self.matcher(expr.compile_filter(filter, self.expr_limits)) if filter else None
        sub = self.subs.get(sub_id)
        if sub is None:
            self.subscribe(sub_id, queue, consumer, 1, now_ms, consumer_name=consumer_name)
            sub = self.subs[sub_id]
            sub.pull = True
            sub.backlog = 0
        elif not sub.pull or sub.queue.name != queue:
            raise ProtocolError(f"subscription {sub_id!r} is not a claim on {queue!r}")
        q = sub.queue
        self.touch(q)
        if (match is None) != (sub.match is None):
            q.filtered += 1 if match is not None else -1
        sub.match, sub.filter_text = match, filter or None
        sub.skip_gen = -1  # a new filter judges the set-aside messages afresh
        sub.lease_ms = lease_ms
        sub.destructive = destructive
        sub.backlog = sub.used + limit
        q.credit_opened(sub)

    def end_claim(self, sub_id: str) -> None:
        """The claim was answered (or timed out): no more credit until the next one."""
        sub = self.subs.get(sub_id)
        if sub is not None and sub.pull:
            sub.backlog = sub.used
            self.touch(sub.queue)

    def sub(self, sub_id: str) -> Subscription:
        """The subscription ``sub_id``, for a change to it or its queue: this step visits
        the queue."""
        s = self.subs.get(sub_id)
        if s is None:
            raise UnknownSubscriptionError(f"no subscription {sub_id!r}")
        self.touch(s.queue)
        return s

    def unsubscribe(self, sub_id: str, now_ms: int, detached: bool = False) -> None:
        """End a subscription; its leased messages return to the queue in order.
        ``detached``: already taken out of its queue's list (``disconnect``)."""
        self.set_time(now_ms)
        sub = self.sub(sub_id)
        del self.subs[sub_id]
        ids = self.subs_of_consumer.get(sub.consumer)
        if ids is not None:
            ids.discard(sub_id)
            if not ids:
                del self.subs_of_consumer[sub.consumer]
                if sub.consumer in self.consumer_names:  # kept until its last events are out (drain)
                    self.names_to_forget.append(sub.consumer)
        sub.queue.remove_subscription(sub, self.now_ms, detached)
        if self.provisional:
            self.forget_provisional(sub.queue)

    def disconnect(self, consumer: str, now_ms: int) -> None:
        """A consumer is gone: every subscription of it ends, leases break at once.
        Its subscriptions leave each queue's list in one pass, not one scan each."""
        ids = sorted(self.subs_of_consumer.get(consumer, ()))
        by_queue: dict[Queue, set[Subscription]] = {}
        for sub_id in ids:
            sub = self.subs[sub_id]
            by_queue.setdefault(sub.queue, set()).add(sub)
        for q, gone in by_queue.items():
            q.detach(gone)
        for sub_id in ids:
            self.unsubscribe(sub_id, now_ms, detached=True)

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
            if q.inactive:
                refused = [seq for seq in refused if not self.ack_inactive(q, sub, seq)]
        # publish -> ack latencies. Seqs published in the same millisecond share one
        # time-index entry, so a batch mostly needs one bisect, not one per message.
        hist, edges, exact = q.ack_latency, ACK_LATENCY_BUCKETS_MS, q.ack_latency_ms
        ti_seq, ti_ms = self.ti_seq, self.ti_ms
        lo = hi = -1  # ti_seq[i] <= seq < hi shares entry i, whose latency is ``latency``
        latency = bucket = total = run = 0
        for seq in seqs:
            if not lo <= seq < hi:
                if run:  # the run of seqs sharing the previous entry: counted at once
                    hist[bucket] += run
                    key = latency_key(latency)
                    exact[key] = exact.get(key, 0) + run
                    total += latency * run
                i = bisect_right(ti_seq, seq) - 1
                latency = now - ti_ms[i] if i >= 0 else 0
                bucket = bisect_left(edges, latency)
                lo = ti_seq[i] if i >= 0 else 0
                hi = ti_seq[i + 1] if i + 1 < len(ti_seq) else self.next_seq
                run = 0
            run += 1
        if run:
            hist[bucket] += run
            key = latency_key(latency)
            exact[key] = exact.get(key, 0) + run
            total += latency * run
        q.ack_latency_sum_ms += total
        return refused

    def settle(self, op: str, sub_id: str, seqs: list[int], epochs: list[int] | None, now_ms: int,
               extra_ms: int = 0, delay_ms: int = -1, error: str = "") -> dict[str, list[int]]:
        """Ack, cancel, expire or extend (``extra_ms``) with fencing: each bookmark's
        ``epochs`` entry is the delivery count it was delivered with, and a settle
        naming a delivery that is no longer live is not applied. Returns the bookmarks
        not applied by result (``lost``, ``done``, ``unknown``: ``Queue.settle_result``);
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

    def release_revoked(self, sub_id: str, seqs: list[int], epochs: list[int], kept: list[int],
                        kept_epochs: list[int], now_ms: int) -> int:
        """A reclaimable subscription's answer to a revoke: ``seqs`` (delivered with
        ``epochs``) were not started and come back, no delivery counted; ``kept`` (with
        ``kept_epochs``) were started. Returns how many came back (``Queue.reclaim``)."""
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

    # ------------------------------------------------------------------ time

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
            if q.tqd_scanning or q.out_of_budget:
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

    def next_expiry_ms(self, q: Queue) -> int | None:
        """When ``q``'s advance may next expire a message by age: its oldest message where
        every advance looks, or its next sweep (group lists, the ordered heap, sleepers:
        looked at once per sweep interval, at the first advance after it is due)."""
        e = q.settings.expiration_ms
        if not e or not q.depth or not self.ti_ms:
            return None
        # Nothing in ``q`` is older than its last recovery point (0: not computed yet), so
        # nothing expires before that was published + e: a day-long expiration is not
        # swept every second for a day.
        i = bisect_right(self.ti_seq, q.rp) - 1
        best = max(q.group_sweep_due_ms, self.ti_ms[max(i, 0)] + e)
        # Ordered queues: the heap's are found by the sweep; those set aside by filters at every advance.
        oldest = q.oldest_skipped() if q.ordered else q.oldest_waiting_ungrouped()
        if oldest is not None:
            i = bisect_right(self.ti_seq, oldest) - 1
            best = min(best, self.ti_ms[i] + e if i >= 0 else self.now_ms + e)
        return best

    # ------------------------------------------------------------------ drain

    def drain(self, now_ms: int) -> Output:
        """Dispatch everything possible; return what to journal, then what to send."""
        self.set_time(now_ms)
        now = self.now_ms
        budget = self.dispatch_budget  # filter evaluations, all queues: the rest waits a step
        if self.visit_all:
            for q in self.queues.values():
                self.touch(q)
        for _ in range(64):  # dead letters can feed other queues; bounded, converges fast
            busy = False
            order = list(self.visiting())
            known = len(self.touched)
            i = 0
            while i < len(order):
                q = order[i]
                i += 1
                if q.inactive and q.active() < q.tqd:
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
                self.flush_events(q)  # causes (cancelled, returned) before their expiries
                if q.expired_out:
                    self.flush_expired(q)
                    busy = True
                if len(self.touched) > known:  # dead letters entered other queues: those later in
                    for t in self.touched[known:]:  # the order are visited in this pass, the others next
                        if t.ordinal > q.ordinal and self.queues.get(t.name) is t:
                            insort(order, t, lo=i, key=ordinal_of)
                    known = len(self.touched)
            if not busy and not any(q.dirty and not q.out_of_budget for q in self.touched):
                break
        touched = self.visiting()
        for q in touched:
            if q.reclaiming.subs:
                self.plan_revokes(q)
            self.flush_events(q)
            if q.ledger.done:  # its dead letters, which read it, are published by now
                q.ledger.done = {}
            if q.reclaiming.done:
                q.reclaiming.done = {}
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
                    self.flush_events(sub.queue)
        if now >= self.rp_due_ms:
            self.rp_due_ms = now + limits.RECOVERY_POINT_INTERVAL_MS
            self.write_recovery_points()
        self.check_overflow_ends()
        if self.names_to_forget:
            for consumer in self.names_to_forget:
                if consumer not in self.subs_of_consumer:
                    self.consumer_names.pop(consumer, None)
            self.names_to_forget = []
        self.leave(self.visiting())
        out = Output(self.records, self.deliveries, self.revokes)
        self.records, self.deliveries = [], []
        if self.revokes:
            self.revokes = []
        self.step_messages = None
        self.last_content = (-1, None)
        if self.step_ids:
            self.step_ids = {}
        return out

    def leave(self, visited: list[Queue]) -> None:
        """The end of a step's visit: each queue's next deadline goes in the heap; those
        with work left (a dispatch or refill stopped at its budget, a refill waiting for
        its messages' commit) stay touched for the next step."""
        left: list[Queue] = []
        for q in visited:
            self.schedule(q)
            if not q.rp_pending:  # (one carried from step to step is not touched again)
                q.rp_pending = True
                self.rp_visited.append(q)
            if q.out_of_budget or q.tqd_scanning or (q.inactive and q.active() < q.tqd):
                left.append(q)
            else:
                q.touched = False
        self.touched = left

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
                        q.remember_dead(seq)
            errors = [q.poison_errors.pop(seq, "") for seq in seqs] if reason == R.REASON_POISON else []
            target = q.settings.dead_letter
            if target and reason not in R.NOT_DEAD_LETTERED:
                # The copies take their bookmarks before the expiry does: any prefix of the
                # journal (what a standby holds when its leader dies) that has the expiry
                # has the dead letters too (a prefix with copies only delivers twice).
                for i, (seq, _, d, group) in enumerate(items):
                    self.publish_dead_letter(q, target, seq, reason, d, group, errors[i] if errors else "")
            self.records.append(R.Event(self.take_seq(), self.now_ms, R.EXPIRED, q.name, "", seqs, ds, reason,
                                        errors=errors))
            if errors:
                self.notices.append(f"queue {q.name[:80]!r}: {len(seqs)} message(s) could not be evaluated and were "
                                    f"set aside as poison (bookmark {seqs[0]}: {errors[0]})")

    def publish_dead_letter(
        self, q: Queue, target: str, seq: int, reason: str, deliveries: int, group: str | None, error: str = ""
    ) -> None:
        """Publish an expired message's copy to ``target`` (the journal copies the payload).

        The engine holds no headers, so a dead-letter queue groups the copy by the
        source queue's group when both queues use the same group header (the default);
        recovery reads the copied headers and agrees.
        """
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
        queues = self.route_or_create(target, dead_letter=False, strict=False)
        new_seq = self.take_seq()
        self.records.append(R.Message(new_seq, self.now_ms, target, headers, b"", None, copy_of=seq))
        self.note_time(self.now_ms, new_seq)
        for dq in queues:
            if dq.filter is not None:
                m = self.message(new_seq)
                if m is None or not dq.filter(m.headers, m.payload, m.topic):
                    continue
            gid = 0
            if group is not None and dq.grouped and dq.settings.group_header == q.settings.group_header:
                if dq.can_take_group(group):
                    gid = dq.group_id(group)
            self.enqueue_copy(dq, new_seq, gid)
        q.dead_lettered += 1

    def flush_events(self, q: Queue) -> None:
        if q.events_out:
            events, q.events_out = q.events_out, {}
            for (kind, consumer, reason), batch in events.items():
                seqs = [s for s, _ in batch]
                ds = [d for _, d in batch]
                self.records.append(R.Event(self.take_seq(), self.now_ms, kind, q.name, consumer, seqs, ds, reason,
                                            self.consumer_names.get(consumer, "")))
        if q.delays_out:  # after their causes (a cancel, a lease expiry)
            self.flush_delays(q)

    def flush_delays(self, q: Queue) -> None:
        """Journal this step's delays, one ``delayed`` event per reason: after a restart
        a message waits for the rest of its time, not again from the start."""
        delays, q.delays_out = q.delays_out, []
        by_reason: dict[str, list[tuple[int, int, int, str]]] = {}
        for item in delays:
            by_reason.setdefault(item[3], []).append(item)
        for reason, items in by_reason.items():
            self.records.append(R.Event(self.take_seq(), self.now_ms, R.DELAYED, q.name, "", [it[0] for it in items],
                                        [it[1] for it in items], reason, "", [it[2] for it in items]))

    def write_recovery_points(self) -> None:
        """Journal the recovery points that moved: of the queues visited since the last
        interval, and of a slice of the others in turn, every queue at least once per
        ``RECOVERY_POINT_REFRESH_MS`` (an idle empty queue's point is the next bookmark,
        which moves; an older point is always safe: recovery reads a little more). Every
        queue's every second made 10,000 idle queues a 10,000-record commit a second."""
        queues = self.queues
        if self.rp_ring_made != self.queues_made:
            self.rp_ring = list(queues.values())
            self.rp_ring_at = 0
            self.rp_ring_made = self.queues_made
        ring = self.rp_ring
        share = len(ring) * limits.RECOVERY_POINT_INTERVAL_MS // limits.RECOVERY_POINT_REFRESH_MS + 1
        at = self.rp_ring_at
        todo = self.rp_visited + ring[at:at + share]
        self.rp_ring_at = at + share if at + share < len(ring) else 0
        self.rp_visited = []
        next_seq = self.next_seq
        for q in todo:
            q.rp_pending = False
            if queues.get(q.name) is not q:
                self.rp_ring_made = -1  # deleted or replaced: the ring is built again next time
                continue
            rp = q.compute_recovery_point(next_seq)
            q.rp = rp
            if self.rp_written.get(q.name) != rp:
                self.rp_written[q.name] = rp
                self.records.append(R.RecoveryPoint(q.name, rp, self.now_ms))
                self.tables_changes += 1
        lowest = next_seq
        for q in queues.values():  # (those not computed now: as last computed, never above what it is)
            if q.rp < lowest:
                lowest = q.rp
        self.prune_time_index(lowest)

    def prune_time_index(self, lowest_seq: int) -> None:
        """Forget publish times of finished messages (keeps memory bounded by what waits)."""
        i = bisect_right(self.ti_seq, lowest_seq) - 1  # keep the entry covering lowest_seq
        if i > 1024:
            del self.ti_ms[:i]
            del self.ti_seq[:i]

    def publish_time_ms(self, seq: int) -> int:
        """When ``seq`` was published (to the ms), from the time index."""
        i = bisect_right(self.ti_seq, seq) - 1
        return self.ti_ms[i] if i >= 0 else self.now_ms

    def min_recovery_point(self) -> int:
        """Below this, every queue is finished with every record (retention may delete)."""
        rps = [q.compute_recovery_point(self.next_seq) for q in self.queues.values()]
        return min(rps, default=self.next_seq)

    # --------------------------------------------------------------- views

    def stats(self, names: list[str] | None = None, limit: int = 0,
              sees: Callable[[str], bool] | None = None) -> dict[str, Any]:
        """Every queue's figures, or only ``names`` (those that exist) and those ``sees``
        allows; with ``limit``, at most that many: the ones holding the most messages
        (waiting and leased; ties in the order the queues were made), so that an answer
        costs the same with 10,000 queues as with ``limit`` (``queues_total`` counts all)."""
        if names is not None:
            chosen = [q for q in (self.queues.get(n) for n in dict.fromkeys(names)) if q is not None]
        else:
            chosen = list(self.queues.values())
        if sees is not None:
            chosen = [q for q in chosen if sees(q.name)]
        total = len(chosen)
        if limit and total > limit:
            busiest = {q.name for q in heapq.nlargest(limit, chosen, key=held_count)}
            chosen = [q for q in chosen if q.name in busiest]
        queues = {}
        for q in chosen:
            queues[q.name] = {
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
                "delayed": len(q.delays.due) + len(q.inactive_due),
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
                "inactive": q.inactive,
                "kind": queue_kind(q.settings),
                "barriers": {"waiting": len(q.barrier.waiting), "released": q.barrier.released},
                "semantics": q.settings.semantics,
                "oldest_ms": self.oldest_waiting_ms(q),
                "oldest_bookmark": q.oldest_waiting() if q.depth else None,  # what zq top explains
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
                queues[q.name]["group_summary"] = q.group_summary()
            if q.fair_share is not None and q.settings.tenant_header:
                queues[q.name]["tenants"] = q.fair_share.summary()
        return {"queues": queues, "queues_total": total, "published": self.published, "duplicates": self.duplicates,
                "next_seq": self.next_seq}

    def oldest_waiting_ms(self, q: Queue) -> int | None:
        """Age of the oldest waiting message (ms), or None when nothing waits."""
        if not q.depth:
            return None
        oldest = q.oldest_waiting()
        return None if oldest is None else self.now_ms - self.publish_time_ms(oldest)

    def peek(self, queue: str, limit: int, filter: str | None = None) -> list[tuple[int, int]]:
        """Waiting messages in delivery order as (bookmark, deliveries), without leasing.

        With ``filter``, only matching ones; at most ``limits.VIEW_SCAN_MAX`` are read.
        """
        q = self.queue(queue)
        match = self.matcher(expr.compile_filter(filter, self.expr_limits)) if filter else None
        out: list[tuple[int, int]] = []
        for i, seq in enumerate(q.waiting()):
            if len(out) >= limit or i >= limits.VIEW_SCAN_MAX:
                break
            if match is None or match(seq):
                out.append((seq, q.deliveries_of(seq)))
        return out

    def query(self, queue: str, group_by: list[str], aggregates: list[str], filter: str | None = None) -> dict[str, Any]:
        """Aggregates over the available messages of ``queue`` (see ``zq.core.query``)."""
        q = self.queue(queue)
        if self.content is None:
            raise NotSupportedError("queries need an engine with a content reader (a journal)")
        qry = Query(group_by, aggregates, filter, self.expr_limits)
        truncated = False
        for i, seq in enumerate(q.waiting()):
            if i >= limits.VIEW_SCAN_MAX:
                truncated = True
                break
            m = self.message(seq)
            if m is not None:
                qry.add(m)
        return {"rows": qry.rows(), "scanned": qry.scanned, "truncated": truncated}

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
        for d in declared:
            settings = msgspec.json.decode(d.settings_json, type=QueueSettings)
            if settings.name not in eng.queues:  # config wins over run-time declarations
                try:
                    eng.add_queue(settings.validate(), declare=False)
                except ZqError as exc:
                    # Declared by an older zq that checked less (a filter of 1e999, a
                    # backtracking topics pattern): not loaded, so it cannot stop the
                    # dispatcher; its messages stay in the journal.
                    eng.notices.append(f"run-time queue {settings.name[:80]!r} not loaded: {exc}; "
                                       "`zq queue create` it again to replace it")
        done: dict[str, set[int]] = {name: set() for name in eng.queues}
        counts: dict[str, dict[int, list[int]]] = {name: {} for name in eng.queues}
        delays: dict[str, dict[int, int]] = {name: {} for name in eng.queues}
        causes: dict[str, CauseFold] = {name: CauseFold() for name in eng.queues}
        for ev in events:
            q = eng.queues.get(ev.queue)
            if q is None:
                continue
            fold_event(q, ev, done[ev.queue], counts[ev.queue], delays[ev.queue])
            if not q.at_most_once:
                causes[ev.queue].fold(ev)
        starts = {name: max(recovery_points.get(name, q.settings.start_seq), q.settings.start_seq)
                  for name, q in eng.queues.items()}
        for msg in messages:
            eng.note_time(msg.ts_ms, msg.seq)
            for q in eng.route(msg.topic):
                if msg.seq < starts[q.name] or msg.seq in done[q.name]:
                    continue
                if q.filter is not None:
                    m = msg if msg.copy_of is None else eng.message(msg.seq)
                    if m is None or not q.filter(m.headers, m.payload, m.topic):
                        continue
                due = delays[q.name].get(msg.seq, 0)
                if q.tqd and not q.admit(msg.seq):
                    if due:
                        q.inactive_due[msg.seq] = due
                    continue  # stays in the journal: read in as the queue drains
                level, key = 0, None
                if q.ordered or q.last_values.fn is not None:
                    m = msg if msg.copy_of is None else eng.message(msg.seq)
                    if m is not None:
                        judged = q.judge(msg.seq, m.headers, m.payload, m.topic)
                        if judged is None:
                            continue  # poison (journaled by a zq that let it in): set aside, said at the first drain
                        level, key = judged
                gid = 0
                barrier = q.barrier.fn is not None and q.barrier.fn(msg.headers, msg.payload, msg.topic)
                if q.grouped and not barrier:
                    name = msg.headers.get(q.settings.group_header)  # type: ignore[arg-type]
                    if name is not None and q.can_take_group(name):
                        gid = q.group_id(name)
                q.enqueue(msg.seq, gid, level)
                if barrier:
                    q.barrier.waiting.append(msg.seq)
                if key is not None:
                    q.last_values.admit(msg.seq, key)
                if q.overflow.sizes is not None:
                    q.overflow.sizes[msg.seq] = len(msg.payload)
                    q.overflow.bytes += len(msg.payload)
                c = counts[q.name].get(msg.seq)
                if c is not None:
                    q.restore_counts(msg.seq, gid, c[0], c[1])
                    causes[q.name].restore(q, msg.seq)
                if due and not barrier and not q.browse:  # it waits for the rest of its time (advance wakes it)
                    q.mark_delayed(msg.seq, gid, due, R.DELAY_BACKOFF, journal=False)
        for q in eng.queues.values():
            q.published = 0
            if q.inactive:  # acknowledged before they were read in: skip them when they are
                q.early_acks = {s for s in done[q.name] if s >= q.tqd_cursor}
            eng.rp_written[q.name] = recovery_points.get(q.name, -1)
            if not q.at_most_once and (q.settings.max_deliveries or q.ledger.limited()):
                expire_exhausted(q)
            eng.names_to_forget.extend(causes[q.name].named)
        return eng


def fold_event(q: Queue, ev: R.Event, done: set[int], counts: dict[int, list[int]], delays: dict[int, int]) -> None:
    kind = ev.kind
    if kind in (R.ACKED, R.EXPIRED) or (kind == R.LEASED and q.at_most_once):
        done.update(ev.bookmarks)
        if kind == R.EXPIRED and ev.reason != R.REASON_BARRIER:
            for seq, d in zip(ev.bookmarks, ev.deliveries):
                if d:
                    q.remember_dead(seq)
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


def latency_key(ms: int) -> int:
    """A measured latency kept to two significant digits (137 ms -> 130, 4,180 -> 4,100;
    under 100 ms exact): at most 90 keys a decade, so ``zq top`` shows measured p50 and
    p99 within 10 % instead of the coarse histogram's bucket edges."""
    if ms < 100:
        return ms
    scale = 10 ** (len(str(ms)) - 2)
    return ms // scale * scale


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


def check_headers(headers: dict[str, str]) -> None:
    if len(headers) > limits.HEADERS_MAX:
        raise LimitError(f"more than {limits.HEADERS_MAX} headers")
    for k, v in headers.items():
        if len(k) > limits.HEADER_BYTES_MAX or len(v) > limits.HEADER_BYTES_MAX:
            raise LimitError(f"header {k[:40]!r} longer than {limits.HEADER_BYTES_MAX}")
        if k.startswith("zq."):
            raise ProtocolError(f"header names starting with 'zq.' are reserved: {k!r}")
