"""Admission: a publish, checked, journaled and enqueued on every queue its topic reaches.

A batch is checked whole before anything of it is journaled (sizes, headers, a
``reject`` queue's room, a queue's group ceiling), so a refused publish leaves no
trace. A message id seen on the topic within the dedup window is not published again:
its first bookmark answers (the journal's index finds the committed ones through the
``find_id`` port; this step's are in ``step_ids`` until they commit). A queue over its
limits breaches once (a notice), and the breach ends once (``check_overflow_ends``).
Copies (dead letters, moves, redrives) enter through ``enqueue_copy``: never refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zq.core import deadlines, entering, limits
from zq.core import records as R
from zq.core.errors import LimitError, ProtocolError, QueueFullError
from zq.core.settings import DEDUP_WINDOW_MS_DEFAULT, check_topic

if TYPE_CHECKING:
    from collections.abc import Callable

    from zq.core.host import Host
    from zq.core.queue import Queue
    from zq.core.routing import Routes
    from zq.core.timeindex import TimeIndex


class Admission:
    """The engine's publishing: what enters its queues, and what they refuse."""

    def __init__(self, host: Host, routes: Routes, times: TimeIndex,
                 find_id: Callable[[str, str], tuple[int, int] | None] | None) -> None:
        self.host = host
        self.routes = routes
        self.times = times
        # The dedup port: (topic, message id) -> (bookmark, publish ms) of its first
        # journaled publish. This step's ids are not journaled yet: ``step_ids``.
        self.find_id = find_id
        self.step_ids: dict[tuple[str, str], tuple[int, int]] = {}
        # What a check (``check``) found in the journal, for the publish that follows it in
        # the same step: one index lookup per output, not two.
        self.looked_up: dict[tuple[str, str], tuple[int, int] | None] = {}
        self.duplicates = 0
        self.published = 0
        self.over_limit: set[str] = set()  # queues in an overflow breach (checked each drain)

    def end_step(self) -> None:
        """This step's records are committed: its message ids are the journal's to find."""
        if self.step_ids:
            self.step_ids = {}
        if self.looked_up:
            self.looked_up = {}

    def publish_many(
        self,
        topic: str,
        items: list[tuple[bytes, dict[str, str], str | None]],
        now_ms: int,
        max_message_bytes: int = limits.MESSAGE_BYTES_MAX,
        not_before_ms: int = 0,
        deadline_ms: int = 0,
    ) -> list[int]:
        """Publish a batch atomically: every message is checked before any is journaled.

        Topic resolution, routing and the group-ceiling check happen once per batch.
        ``not_before_ms`` (Unix ms): no message of the batch goes before then.
        ``deadline_ms`` (Unix ms): one still waiting then expires (``zq.core.deadlines``).
        """
        self.host.set_time(now_ms)
        if not 0 <= not_before_ms <= self.host.now_ms + limits.DURATION_MS_MAX:
            raise ProtocolError("a publish's not-before time must be 0..100 years from now")
        if not 0 <= deadline_ms <= self.host.now_ms + limits.DURATION_MS_MAX:
            raise ProtocolError("a publish's deadline must be 0..100 years from now")
        due = not_before_ms if not_before_ms > self.host.now_ms else 0
        topic = self.routes.resolve_topic(topic)
        check_topic(topic)
        check_items(items, max_message_bytes)
        if deadline_ms:  # journaled with each message: recovery and standbys see it there
            stamp = str(deadline_ms)
            items = [(payload, {**headers, deadlines.HEADER: stamp}, msg_id) for payload, headers, msg_id in items]
        queues = self.routes.route_or_create(topic)
        known: dict[int, int] = {}  # index in items -> bookmark of its first publish
        if any(msg_id is not None for _, _, msg_id in items):
            known = self.seen_ids(topic, items, queues, now_ms)
            if known:
                fresh = [it for i, it in enumerate(items) if i not in known]
                seqs = self.publish_fresh(topic, fresh, queues, now_ms, due, deadline_ms) if fresh else []
                out, it = [], iter(seqs)
                for i in range(len(items)):
                    out.append(known[i] if i in known else next(it))
                return out
        return self.publish_fresh(topic, items, queues, now_ms, due, deadline_ms)

    def check(self, outputs: list[tuple[str, list[tuple[bytes, dict[str, str], str | None]]]], now_ms: int,
              max_message_bytes: int = limits.MESSAGE_BYTES_MAX) -> None:
        """Would ``publish_many`` take each of these batches, one after the other? Raises
        what it would raise (sizes, headers, names, a ``reject`` queue's room, a group
        ceiling), journaling and enqueueing nothing: a transaction
        (``zq.core.transactions``) checks all its outputs before any of it happens. A
        queue several batches reach is judged on all they bring it together; only
        messages the dedup window would not absorb count, as ``publish_many`` counts
        them. (A topic no queue covers would get a fresh queue of the defaults, which
        takes anything: it is not created here.)"""
        reaching: dict[str, tuple[Queue, list[tuple[str, list[tuple[bytes, dict[str, str], str | None]]]]]] = {}
        made: set[str] = set()
        for topic, items in outputs:
            topic = self.routes.resolve_topic(topic)
            check_topic(topic)
            check_items(items, max_message_bytes)
            queues = self.routes.route(topic)
            if not queues and topic in self.host.queues:
                self.routes.route_or_create(topic)  # a queue's reserved name: raises what the publish would
            if not queues and self.routes.auto_queues:
                made.add(topic)
                if len(self.host.queues) + len(made) > limits.QUEUES_MAX:
                    raise LimitError(f"too many queues (max {limits.QUEUES_MAX})")
            if any(msg_id is not None for _, _, msg_id in items):
                known = self.seen_ids(topic, items, queues, now_ms, count=False)
                items = [it for i, it in enumerate(items) if i not in known]
            for q in queues:
                reaching.setdefault(q.name, (q, []))[1].append((topic, items))
        for q, parts in reaching.values():
            self.check_queue(q, parts)

    def check_queue(self, q: Queue, parts: list[tuple[str, list[tuple[bytes, dict[str, str], str | None]]]]) -> dict[str, bool]:
        """A ``reject`` queue's room and a grouped queue's ceiling for what ``parts``
        ([(topic, items)]) bring it; returns, for its group header, whether any item
        names a group."""
        named: dict[str, bool] = {}  # group header -> does any item carry it?
        if q.overflow.limited and q.settings.overflow == "reject":
            self.check_room(q, parts)
        if q.grouped:
            header = q.settings.group_header
            names = {h[header] for _, items in parts for _, h, _ in items if header in h}  # type: ignore[index]
            named[header] = bool(names)  # type: ignore[index]
            fresh = [n for n in names if n not in q.gid_of]
            if len(q.groups) + len(fresh) > q.settings.max_groups:
                raise LimitError(f"queue {q.name!r} reached max_groups={q.settings.max_groups}")
        return named

    def seen_ids(self, topic: str, items: list[tuple[bytes, dict[str, str], str | None]], queues: list[Queue],
                 now_ms: int, count: bool = True) -> dict[int, int]:
        """Items whose message id was published to ``topic`` within the dedup window
        (``count``: counted as duplicates; a check only looks)."""
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
            key = (topic, msg_id)
            hit = self.step_ids.get(key)
            if hit is None and self.find_id is not None:
                if key in self.looked_up:  # a transaction's check asked the journal already
                    hit = self.looked_up.pop(key)
                else:
                    hit = self.find_id(topic, msg_id)
                    if not count:
                        self.looked_up[key] = hit
            if hit is not None and hit[1] >= now_ms - window:
                known[i] = hit[0]
            else:
                batch[msg_id] = i
        if known:
            if count:
                self.duplicates += len(known)
            # Repeats inside the batch get the bookmark their first occurrence will get.
            order = [i for i in range(len(items)) if i not in known]
            first = self.host.next_seq
            for i, v in list(known.items()):
                if v < 0:
                    known[i] = first + order.index(-1 - v)
        return known

    def publish_fresh(self, topic: str, items: list[tuple[bytes, dict[str, str], str | None]], queues: list[Queue],
                      now_ms: int, due: int = 0, deadline: int = 0) -> list[int]:
        named: dict[str, bool] = {}  # group header -> does any item carry it?
        for q in queues:
            if q.grouped or q.overflow.limited:
                named.update(self.check_queue(q, [(topic, items)]))
        first = self.host.next_seq
        self.host.next_seq += len(items)
        self.times.note(now_ms, first)
        append = self.host.records.append
        message = R.Message
        for i, (payload, headers, msg_id) in enumerate(items):
            append(message(first + i, now_ms, topic, headers, payload, msg_id))
            if msg_id is not None:
                self.step_ids[(topic, msg_id)] = (first + i, now_ms)
        for q in queues:
            self.host.touch(q)
            accept = q.filter
            if q.barrier.fn is not None or q.ordered or q.target.limit or due or deadline or q.last_values.fn is not None:
                self.enqueue_each(q, topic, items, first, due, deadline)
            elif q.grouped and accept is None and not named[q.settings.group_header]:  # type: ignore[index]
                entering.enqueue_run(q, first, len(items))  # no message of the batch names a group
            elif q.grouped:
                header = q.settings.group_header
                for i, (payload, headers, _) in enumerate(items):
                    if accept is not None and not accept(headers, payload, topic):
                        continue
                    name = headers.get(header)  # type: ignore[arg-type]
                    entering.enqueue(q, first + i, q.group_id(name) if name is not None else 0)
            elif accept is not None:
                for i, (payload, headers, _) in enumerate(items):
                    if accept(headers, payload, topic):
                        entering.enqueue(q, first + i, 0)
            else:
                entering.enqueue_run(q, first, len(items))
            if q.overflow.limited:
                self.after_enqueue_limited(q, topic, items, first)
        self.published += len(items)
        return list(range(first, first + len(items)))

    def enqueue_each(self, q: Queue, topic: str, items: list[tuple[bytes, dict[str, str], str | None]],
                     first: int, due: int = 0, deadline: int = 0) -> None:
        """Enqueue one by one on a queue that judges each message (barrier, priority, sort
        key, last value, target depth), or when they are delayed (``due``: Unix ms) or
        have a deadline."""
        accept, header = q.filter, q.settings.group_header
        for i, (payload, headers, _) in enumerate(items):
            if accept is not None and not accept(headers, payload, topic):
                continue
            self.enqueue_one(q, first + i, headers, payload, topic, header, due, deadline)

    def enqueue_one(self, q: Queue, seq: int, headers: dict[str, str], payload: bytes, topic: str,
                    header: str | None, due: int = 0, deadline: int = 0) -> None:
        if q.target.limit and not q.target.admit(seq):
            if due:  # journaled below; kept here until the message is read back in
                q.target.due[seq] = due
                q.delays_out.append((seq, 0, due, R.DELAY_PUBLISHED))
            return  # journal-only for now: read back as the queue drains
        level, key = 0, None
        if q.ordered or q.last_values.fn is not None:
            judged = entering.judge(q, seq, headers, payload, topic)
            if judged is None:
                return  # poison: set aside, dead-lettered when this step drains
            level, key = judged
        if q.barrier.fn is not None and q.barrier.fn(headers, payload, topic):
            entering.enqueue(q, seq, 0)
            q.barrier.waiting.append(seq)  # a barrier goes when everything before it is acked: a delay has no meaning
        else:
            name = headers.get(header) if q.grouped and header else None  # type: ignore[arg-type]
            gid = q.group_id(name) if name is not None else 0
            entering.enqueue(q, seq, gid, level)
            if due and not q.browse:  # browsers see every message at once: nothing is leased
                q.mark_delayed(seq, gid, due, R.DELAY_PUBLISHED)
            if deadline and not q.browse:
                q.deadlines.mark(seq, deadline)
        if key is not None:
            q.last_values.admit(seq, key)

    def check_room(self, q: Queue, parts: list[tuple[str, list[tuple[bytes, dict[str, str], str | None]]]]) -> None:
        """overflow = "reject": refuse the whole batch (``parts``: [(topic, items)]) before
        anything is journaled."""
        entering = [p for topic, items in parts for p, h, _ in items if q.filter is None or q.filter(h, p, topic)]
        if entering and q.overflow.would_overflow(len(entering), sum(map(len, entering))):
            q.overflow.rejected += len(entering)
            if not q.overflow.blocked:
                q.overflow.blocked = True
                q.overflow.breaches += 1
                self.over_limit.add(q.name)
                self.host.notices.append(f"queue {q.name!r} is full: publishes are refused (overflow = reject)")
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
            self.host.notices.append(f"queue {q.name!r} reached its limit: {action}")
        if q.settings.overflow == "ring":
            q.overflow.make_room()

    def enqueue_copy(self, q: Queue, seq: int, gid: int) -> None:
        """A copy (dead letter, move, redrive) enters ``q``: it is never refused, but it
        counts toward the queue's limits (ring queues make room)."""
        self.host.touch(q)
        if q.target.limit and not q.target.admit(seq):
            return  # journal-only for now: read back as the queue drains
        level, key = 0, None
        if q.ordered or q.last_values.fn is not None:
            m = self.host.message(seq)
            if m is not None:
                judged = entering.judge(q, seq, m.headers, m.payload, m.topic)
                if judged is None:
                    return  # poison: set aside, dead-lettered when this step drains
                level, key = judged
        if q.barrier.fn is not None:
            m = self.host.message(seq)
            if m is not None and q.barrier.fn(m.headers, m.payload, m.topic):
                gid = 0
                q.barrier.waiting.append(seq)
        entering.enqueue(q, seq, gid, level)
        if key is not None:
            q.last_values.admit(seq, key)
        if q.overflow.limited:
            if q.overflow.sizes is not None:
                m = self.host.message(seq)
                size = len(m.payload) if m is not None else 0
                q.overflow.sizes[seq] = size
                q.overflow.bytes += size
            if q.overflow.over() and q.settings.overflow == "ring":
                q.overflow.make_room()

    def check_overflow_ends(self) -> None:
        """A breach ends when the queue is back under its limits (flow-control: under
        ``resume_percent`` of them); logged once, like its start."""
        for name in list(self.over_limit):
            q = self.host.queues.get(name)
            if q is None:  # deleted
                self.over_limit.discard(name)
                continue
            percent = q.settings.resume_percent if q.settings.overflow == "flow-control" else 100
            if not q.overflow.over(percent):
                q.overflow.blocked = False
                self.over_limit.discard(name)
                self.host.notices.append(f"queue {q.name!r} is back under its limits")

    def withheld(self, topic: str) -> list[str]:
        """Flow-control queues over their limits among those ``topic`` feeds: a publish
        confirmation waits until they are not (the adapter holds it)."""
        queues = self.routes.route(self.routes.resolve_topic(topic))
        return [q.name for q in queues if q.overflow.blocked and q.settings.overflow == "flow-control"]


def check_items(items: list[tuple[bytes, dict[str, str], str | None]], max_message_bytes: int) -> None:
    """Each message's size, headers and id, within the limits."""
    max_bytes = min(max_message_bytes, limits.MESSAGE_BYTES_MAX)
    for payload, headers, msg_id in items:
        if len(payload) > max_bytes:
            raise LimitError(f"message of {len(payload)} bytes exceeds max_message_size {max_bytes}")
        if headers:
            check_headers(headers)
        if msg_id is not None and len(msg_id) > limits.HEADER_BYTES_MAX:
            raise LimitError(f"message id longer than {limits.HEADER_BYTES_MAX}")


def check_headers(headers: dict[str, str]) -> None:
    if len(headers) > limits.HEADERS_MAX:
        raise LimitError(f"more than {limits.HEADERS_MAX} headers")
    for k, v in headers.items():
        if len(k) > limits.HEADER_BYTES_MAX or len(v) > limits.HEADER_BYTES_MAX:
            raise LimitError(f"header {k[:40]!r} longer than {limits.HEADER_BYTES_MAX}")
        if k.startswith("zq."):
            raise ProtocolError(f"header names starting with 'zq.' are reserved: {k!r}")
