"""What a client hands its caller: ``Message`` (settle it once: ack, cancel, expire,
extend), ``Subscription`` (iterate it; closing it unsubscribes), ``Replay`` (a journal
read with no queue semantics) and ``PublishFuture`` (a publish's bookmark, once durable).

They talk to the client that made them through ``Session``: the I/O thread's queues and
wake-up, as the ``Client`` provides them (this module does not import the client).
"""

from __future__ import annotations

import collections
import itertools
import logging
import queue as queue_mod
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple, Protocol

import msgspec

from zq import wire
from zq.client.reclaim import Unstarted
from zq.client.session import (
    SessionLost,
    bookmark_arg,
    cancel_options,
    check_tx,
    duration_arg,
    outputs_arg,
    results_by_bookmark,
    settle_command,
    tx_outcome,
)
from zq.core import records as R
from zq.core.errors import ZqError

log = logging.getLogger("zq.client")

ACK_DELAY = 0.001  # seconds an ack may wait to share a frame with others


class Queued:
    """What a settle returns: it is queued for the wire at once, so there is nothing to
    wait for; asyncio code may still write ``await msg.ack()`` (it returns at once)."""

    __slots__ = ()

    def __await__(self) -> Iterator[None]:
        return iter(())

    def __repr__(self) -> str:
        return "<queued>"


QUEUED = Queued()


class Session(Protocol):
    """What subscriptions and messages need of their client."""

    generation: int  # sessions opened so far: messages of an older one are not settled
    _order: itertools.count  # the client's order of calls: frames leave in it
    _subs: dict[str, Subscription]
    _serving: bool  # a welcomed session is open

    def _wake(self) -> None: ...
    def _submit(self, cmd: object) -> None: ...
    def _request(self, make: Callable[[int], object], *, timeout: float = 30.0, wait: bool = True) -> Any: ...
    def _flush_and_wait(self, timeout: float = 10.0) -> None: ...
    def admin(self, op: str, timeout: float = 30.0, **args: object) -> object: ...


class PublishBatch:
    """The messages of one PUBLISH frame: one wait object for all of them."""

    __slots__ = ("topic", "items", "size", "event", "bookmarks", "error", "callbacks", "order", "delay_ms",
                 "not_before_ms", "ttl_ms", "expires_at_ms")

    def __init__(self, topic: str, delay_ms: int = 0, not_before_ms: int = 0, ttl_ms: int = 0,
                 expires_at_ms: int = 0) -> None:
        self.topic = topic
        self.delay_ms = delay_ms  # a delayed publish: every message of the frame waits the same
        self.not_before_ms = not_before_ms
        self.ttl_ms = ttl_ms  # ... and has the same deadline (zq.core.deadlines)
        self.expires_at_ms = expires_at_ms
        self.order = 0  # its place in the client's order of calls, once sealed
        self.items: list[tuple[bytes, dict[str, str], str | None]] = []
        self.size = 0
        self.event = threading.Event()
        self.bookmarks: list[int] | None = None
        self.error: BaseException | None = None
        self.callbacks: list[tuple[Callable[[Any], None], Any]] = []

    def settle(self, bookmarks: list[int] | None, error: BaseException | None) -> None:
        if self.event.is_set():
            return
        self.bookmarks, self.error = bookmarks, error
        self.event.set()
        for fn, fut in self.callbacks:
            try:
                fn(fut)
            except Exception:  # pragma: no cover - a user callback failed
                log.exception("publish callback failed")
        self.callbacks = []


class PublishFuture:
    """The bookmark of one published message, when it is durable.

    The subset of ``concurrent.futures.Future`` that publishing needs (``result``,
    ``exception``, ``done``, ``add_done_callback``), without a lock and a condition
    per message: all messages of a frame share one ``PublishBatch``.
    """

    __slots__ = ("batch", "index")

    def __init__(self, batch: PublishBatch, index: int) -> None:
        self.batch = batch
        self.index = index

    def done(self) -> bool:
        return self.batch.event.is_set()

    def result(self, timeout: float | None = None) -> int:
        if not self.batch.event.wait(timeout):
            raise TimeoutError("publish not confirmed in time")
        if self.batch.error is not None:
            raise self.batch.error
        assert self.batch.bookmarks is not None
        return self.batch.bookmarks[self.index]

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if not self.batch.event.wait(timeout):
            raise TimeoutError("publish not confirmed in time")
        return self.batch.error

    def add_done_callback(self, fn: Callable[["PublishFuture"], None]) -> None:
        batch = self.batch
        if batch.event.is_set():
            fn(self)
            return
        batch.callbacks.append((fn, self))
        if batch.event.is_set() and batch.callbacks:  # settled meanwhile: run what is left
            callbacks, batch.callbacks = batch.callbacks, []
            for cb, fut in callbacks:
                cb(fut)


def cancel_messages(owner: Any, messages: Iterable["Message"], wait: bool, delay: float | None,
                    error: str | BaseException | None) -> dict[int, str] | None:
    """``cancel_many`` of a Subscription or a Worker (they settle alike): a cancel with
    its own delay or error goes at once and is answered; a plain one is batched."""
    options = cancel_options(delay, error)
    if options is None:
        return owner._settle_many("cancel", messages, wait)
    return owner._settle_wait("cancel", [m for m in messages if m.deliveries], delay_ms=options[0], error=options[1])


def count_verdicts(holder: Any, results: dict[int, str]) -> dict[int, str]:
    """Count a waited-for settle's verdicts as the batched ones are (``refused``,
    ``lost``) on ``holder``, a subscription or a worker; returns ``results``."""
    for verdict in results.values():
        if verdict != "ok":
            holder.refused += 1
            if verdict == "lost":
                holder.lost += 1
    return results

class Verdict(str):
    """A settle-and-publish's verdict on one message (``msg.ack(publish=...)``): ``"ok"``
    when the settle and every output were committed as one, ``bookmarks`` then giving
    the outputs' bookmarks in order (an output the dedup window absorbed: its first
    one); otherwise the message's verdict as ``ack(wait=True)`` gives it (``"lost"``,
    ``"dead"``, ``"done"``, ``"unknown"``) and nothing was published."""

    bookmarks: list[int]

    def __new__(cls, verdict: str, bookmarks: Iterable[int] = ()) -> "Verdict":
        v = super().__new__(cls, verdict)
        v.bookmarks = list(bookmarks)
        return v


class Transaction(NamedTuple):
    """What ``commit`` did: ``committed`` (the settles and every output as one, or none
    of it), each message's verdict (``ok``; not committed: ``lost`` / ``dead`` /
    ``done`` / ``unknown`` for the deliveries that were not live, ``held`` for those
    still this consumer's to settle), and the outputs' bookmarks in order."""

    committed: bool
    verdicts: dict[int, str]
    bookmarks: list[int]


def commit_messages(owner: Any, messages: Iterable["Message"], publish: Iterable[tuple], op: str,
                    delay: float | None, error: str | BaseException | None, timeout: float,
                    wait: bool = True) -> Transaction | None:
    """``commit`` of a Subscription or a Worker (``owner``, whose ``_ask`` sends a request
    and waits for its REPLY): settle ``messages`` by ``op`` and publish ``publish`` in one
    commit, fenced by each delivery's count. ``wait=False``: sent, not waited for (the
    verdicts are counted as batched acks' are when the answer comes; None returned)."""
    if op not in ("ack", "cancel"):
        raise ValueError(f"a transaction settles with ack or cancel, not {op!r}")
    if op != "cancel" and (delay is not None or error is not None):
        raise ValueError("only a cancel takes a delay or an error")
    outputs = outputs_arg(publish)
    delay_ms, text = cancel_options(delay, error) or (-1, "")
    messages = list(messages)
    if not messages:
        raise ValueError("a transaction settles at least one message")
    check_tx([m.bookmark for m in messages], outputs)
    if any(not m.deliveries for m in messages):
        raise ValueError("a replayed or browsed message holds no lease to settle in a transaction")
    gen = owner._generation()
    if any(m._generation != gen for m in messages):  # their leases ended with an earlier session
        verdicts = {m.bookmark: "lost" if m._generation != gen else "held" for m in messages}
        count_verdicts(owner, {b: v for b, v in verdicts.items() if v != "held"})
        return Transaction(False, verdicts, [])
    bookmarks = [m.bookmark for m in messages]
    epochs = [m.deliveries for m in messages]
    if not wait:
        owner._commit_later((op, bookmarks, epochs, outputs, delay_ms, text),
                            lambda answer: tx_answered(owner, answer, bookmarks, epochs))
        return None
    make = lambda req: wire.Transact(req, owner.sub_id, op, bookmarks, epochs, outputs, delay_ms, text)  # noqa: E731
    try:
        answer = owner._ask(make, timeout)  # (an ERROR raises: nothing happened, the caller is told)
    except SessionLost as lost:  # committed or not, the leases ended with the session: the message goes again if not
        answer = lost
    return tx_answered(owner, answer, bookmarks, epochs)


def tx_answered(owner: Any, answer: Any, bookmarks: list[int], epochs: list[int]) -> Transaction:
    """A transaction's answer (its REPLY's data, or the error it got), counted as a batched
    ack's verdicts are (``refused``, ``lost``). An error nobody waited for (nothing
    happened: the messages stay leased until their leases end, then go again) is logged."""
    if isinstance(answer, SessionLost):
        return Transaction(False, count_verdicts(owner, dict.fromkeys(bookmarks, "lost")), [])
    if isinstance(answer, BaseException):
        owner.refused += len(bookmarks)
        log.error("a transaction settling %s was refused, nothing of it happened: %s", bookmarks[:8], answer)
        return Transaction(False, dict.fromkeys(bookmarks, "held"), [])
    committed, verdicts, published = tx_outcome(answer, bookmarks)
    if committed and owner.unstarted is not None:
        owner.unstarted.settled(zip(bookmarks, epochs))
    count_verdicts(owner, {b: v for b, v in verdicts.items() if v != "held"})
    return Transaction(committed, verdicts, published)


class Message:
    """One delivered message. Settle it once: ``ack``, ``cancel``, ``expire``."""

    __slots__ = ("data", "bookmark", "topic", "headers", "deliveries", "ts_ms", "msg_id", "_sub", "_generation")

    def __init__(self, record: "R.Message", deliveries: int, sub: "Subscription", generation: int) -> None:
        self.data: bytes = record.payload
        self.bookmark: int = record.seq
        self.topic: str = record.topic
        self.headers: dict[str, str] = record.headers
        self.deliveries: int = deliveries
        self.ts_ms: int = record.ts_ms
        self.msg_id: str | None = record.msg_id
        self._sub = sub
        self._generation = generation

    @property
    def group(self) -> str | None:
        """The message's group as its queue sees it: the queue's ``group_header``."""
        header = getattr(self._sub, "group_header", "group")
        return self.headers.get(header) if header else None

    def ack(self, *, wait: bool | None = None, publish: Iterable[tuple] | None = None) -> Any:
        """Acknowledge. The settle is queued for the wire and this returns at once; with
        ``wait=True`` it waits for the dispatcher's verdict and returns it: ``"ok"``,
        ``"lost"`` (this delivery's lease had ended and the message went, or will go,
        to someone again: the work was not recorded), ``"dead"`` (its lease had ended
        and it was dead-lettered since, or dropped or expired: nobody will do it),
        ``"done"`` (already settled) or ``"unknown"``. Every settle is fenced by this
        delivery's count either way, and every verdict but ``"ok"`` is counted in the
        subscription's ``refused`` (``"lost"`` also in ``lost``), batched or waited for.

        ``publish``: what this message produced, ``[(topic, data[, headers[, msg_id]]),
        ...]``, published in the same commit as the ack: both happen or neither does
        (fenced: if this delivery is no longer live, nothing is published). Waits, and
        returns a ``Verdict`` (``"ok"`` with the outputs' ``bookmarks``); a bad output
        raises (``ZqError``), and nothing happened. With ``wait=False`` it is sent and
        not waited for (many in flight: the dispatcher commits them together): the
        verdict is counted as a batched ack's, an error logged. Either way an output
        without a ``msg_id`` gets one derived from this message (its queue, bookmark
        and the output's place), so if this message is processed again after a lost
        answer or a failover, the same outputs are not stored twice within the dedup
        window."""
        if publish is not None:
            return self._commit("ack", publish, None, None, wait is not False)
        return self._settle("ack", bool(wait))

    def cancel(self, *, wait: bool | None = None, delay: float | None = None, error: str | BaseException | None = None,
               publish: Iterable[tuple] | None = None) -> Any:
        """Give the message back: it goes again after its queue's retry schedule
        (``backoff``; at once without one), or after ``delay`` seconds when given (0: at
        once). With ``error`` (why the work failed: a string or the exception) the
        delivery counts as *failed* (``max_failures``) and its dead letter will carry the
        error. A cancel with a delay or an error is sent at once and returns the verdict.
        ``publish``: outputs published in the same commit as the cancel (see ``ack``)."""
        if publish is not None:
            return self._commit("cancel", publish, delay, error, wait is not False)
        options = cancel_options(delay, error)
        if options is not None:
            if not self.deliveries:
                return "ok"
            return self._sub._settle_wait("cancel", [self], delay_ms=options[0], error=options[1])[self.bookmark]
        return self._settle("cancel", bool(wait))

    def expire(self, *, wait: bool = False) -> Any:
        return self._settle("expire", wait)

    def start(self) -> bool:
        """Start the work: True if it is this worker's to do. On a subscription with
        ``reclaimable="explicit"`` a message taken but not started may be given back to
        the queue for an idle worker; then this returns False and the message must be
        skipped (it goes to someone else; settling it is answered ``lost``). Otherwise
        taking the message started it, and this is True while its session lives."""
        return self._sub._start(self)  # type: ignore[no-any-return]

    def _commit(self, op: str, publish: Iterable[tuple], delay: float | None,
                error: str | BaseException | None, wait: bool) -> Any:
        tx = self._sub.commit([self], publish, op=op, delay=delay, error=error, wait=wait)
        return QUEUED if tx is None else Verdict(tx.verdicts[self.bookmark], tx.bookmarks)

    def _settle(self, op: str, wait: bool) -> Any:
        if not self.deliveries:  # 0: nothing to settle (a replayed or barrier message holds no lease)
            return "ok" if wait else QUEUED
        if wait:
            return self._sub._settle_wait(op, [self])[self.bookmark]
        self._sub._settle(op, self)
        return QUEUED

    def extend(self, seconds: float) -> Queued:
        self._sub._extend(self, duration_arg(seconds, "extend"))
        return QUEUED

    def __repr__(self) -> str:
        return f"Message(bookmark={self.bookmark}, topic={self.topic!r}, deliveries={self.deliveries}, data={self.data[:40]!r})"


_END = object()  # in a replay's inbox: its END arrived; nothing follows


class MessageStream:
    """``for msg in sub``: each step is a ``get()`` with no timeout."""

    def commit(self, messages: Iterable[Message], publish: Iterable[tuple] = (), *, op: str = "ack",
               delay: float | None = None, error: str | BaseException | None = None,
               timeout: float = 30.0, wait: bool = True) -> Transaction | None:
        """Settle ``messages`` (``op``: ``ack`` or ``cancel``, with a cancel's ``delay``
        and ``error``) and publish ``publish`` (``[(topic, data[, headers[, msg_id]])]``)
        in one commit: all of it happens, or none of it (``Message.ack(publish=...)`` is
        the one-message form; its docstring says what is guaranteed). ``wait=False``:
        sent and not waited for (None; the verdicts counted as batched acks' are)."""
        return commit_messages(self, messages, publish, op, delay, error, timeout, wait)

    def get(self, timeout: float | None = None) -> Message | None:
        raise NotImplementedError

    def __iter__(self) -> Iterator[Message]:
        return self

    def __next__(self) -> Message:
        msg = self.get()
        assert msg is not None
        return msg


class Subscription(MessageStream):
    """Iterate to receive messages; closing it (or leaving ``with``) unsubscribes."""

    def __init__(self, client: Session, sub_id: str, queue: str, max_backlog: int, filter: str | None = None,
                 reclaimable: bool | str = False) -> None:
        self.client = client
        self.sub_id = sub_id
        self.queue = queue
        self.max_backlog = max_backlog
        self.filter = filter
        self.reclaimable = reclaimable
        # Reclaimable: what was delivered and not started (zq.client.reclaim).
        self.unstarted = Unstarted(reclaimable == "explicit") if reclaimable else None
        self.backlog = 0  # granted by the server
        self.group_header: str | None = "group"  # the queue's, from SUBSCRIBED (what Message.group reads)
        # A queue.Queue, not a SimpleQueue: CPython's SimpleQueue.get(timeout) waits for good
        # when a signal handler runs past its deadline (it then waits a negative time, which
        # means forever); a SIGTERMed consumer hung in get() there. Queue's lock wait does not.
        self.inbox: queue_mod.Queue[tuple[int, list[tuple[R.Message, int]]] | None] = queue_mod.Queue()
        self.local: collections.deque[Message] = collections.deque()
        # op, bookmark, generation, place in the client's order of calls (``Client._order``), epoch
        self.settle: collections.deque[tuple[str, int, int, int, int]] = collections.deque()
        self.refused = 0  # settles the dispatcher did not apply (any result but ok)
        self.lost = 0  # of them: deliveries whose lease had ended (the work went to someone again)
        self.closed = False
        self.ended = False  # a replay reached its END
        self.sink: Callable[[list[Message]], None] | None = None
        # I/O-thread-only counters: messages received, settles sent (this session).
        self.received = 0
        self.settles_taken = 0
        self.settle_since = 0.0  # when the oldest unsent settle was first seen

    def get(self, timeout: float | None = None) -> Message | None:
        """The next message, or None when ``timeout`` seconds pass without one."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            while not self.local:
                if self.closed or self.ended:
                    raise StopIteration
                wait = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    item = self.inbox.get(timeout=wait if wait is None else min(wait, 1.0))
                except queue_mod.Empty:
                    if deadline is not None and time.monotonic() >= deadline:
                        return None
                    continue
                if not self._take(item):  # a replay's END: everything before it was taken
                    self.ended = True
                    raise StopIteration
            msg = self.local.popleft()
            if self.unstarted is None or self.unstarted.take(msg.bookmark, msg.deliveries):
                return msg
            # given back to the queue before it was taken: another worker has it

    def _start(self, msg: Message) -> bool:
        if msg._generation != self.client.generation:
            return False  # its session is gone, and its lease with it
        return self.unstarted is None or self.unstarted.start(msg.bookmark, msg.deliveries)

    def _take(self, item: tuple[int, list[tuple[R.Message, int]]] | None | object) -> bool:
        """Move an inbox item's messages into ``local``; False for a replay's END."""
        if item is _END:
            return False
        if item is not None:
            generation, batch = item  # type: ignore[misc]
            if generation == self.client.generation:  # else: a session that is gone; redelivered
                self.local.extend(Message(r, n, self, generation) for r, n in batch)
        return True

    def get_many(self, max_messages: int, timeout: float | None = None) -> list[Message]:
        """Up to ``max_messages`` messages: waits (up to ``timeout``) for the first, then
        takes what has already arrived, without waiting for more. Empty on timeout.

        With ``ack_many`` this is the batch path (as SQS ReceiveMessage or a NATS fetch):
        one call and one settle per batch instead of one per message."""
        first = self.get(timeout)
        if first is None:
            return []
        out = [first]
        local = self.local
        unstarted = self.unstarted
        while len(out) < max_messages:
            if local:
                msg = local.popleft()
                if unstarted is None or unstarted.take(msg.bookmark, msg.deliveries):
                    out.append(msg)
                continue
            try:
                item = self.inbox.get_nowait()
            except queue_mod.Empty:
                break
            if not self._take(item):
                self.inbox.put(_END)  # the next get() ends the iteration
                break
        return out

    def ack_many(self, messages: Iterable[Message], *, wait: bool = False) -> dict[int, str] | None:
        """Acknowledge several messages with one wake-up of the I/O thread; with
        ``wait=True``, wait for the verdicts: bookmark -> ``ok`` / ``lost`` / ``done``
        / ``unknown`` (see ``Message.ack``)."""
        return self._settle_many("ack", messages, wait)

    def cancel_many(self, messages: Iterable[Message], *, wait: bool = False, delay: float | None = None,
                    error: str | BaseException | None = None) -> dict[int, str] | None:
        """Cancel several messages: each goes again after the queue's backoff, or after
        ``delay`` seconds (0: at once); ``error``: they failed (see ``Message.cancel``).
        With a delay or an error they are sent at once and answered, like ``wait=True``."""
        return cancel_messages(self, messages, wait, delay, error)

    def _settle_many(self, op: str, messages: Iterable[Message], wait: bool = False) -> dict[int, str] | None:
        if self.unstarted is not None and self.unstarted.explicit:
            messages = list(messages)
            self.unstarted.settled((m.bookmark, m.deliveries) for m in messages)
        if wait:
            return self._settle_wait(op, [m for m in messages if m.deliveries])
        settle, order = self.settle, self.client._order
        settle.extend((op, m.bookmark, m._generation, next(order), m.deliveries) for m in messages if m.deliveries)
        if settle:
            self.client._wake()
        return None

    def _settle_wait(self, op: str, messages: list[Message], timeout: float = 30.0,
                     delay_ms: int = -1, error: str = "") -> dict[int, str]:
        """Settle now and wait for the dispatcher's verdict on each message. A message
        of an earlier session is ``lost`` without asking: its lease ended with it."""
        gen = self.client.generation
        results = {m.bookmark: "lost" for m in messages if m._generation != gen}
        live = [m for m in messages if m._generation == gen]
        if self.unstarted is not None:
            self.unstarted.settled((m.bookmark, m.deliveries) for m in live)
        if live:
            bookmarks = [m.bookmark for m in live]
            epochs = [m.deliveries for m in live]
            try:
                answer = self.client._request(lambda req: settle_command(op, self.sub_id, bookmarks, epochs, req,
                                                                         delay_ms, error), timeout=timeout)
            except SessionLost:  # the leases ended with the session
                return count_verdicts(self, {**results, **{b: "lost" for b in bookmarks}})
            results.update(results_by_bookmark(answer, bookmarks))
        return count_verdicts(self, results)

    def _generation(self) -> int:
        return self.client.generation  # type: ignore[no-any-return]

    def _ask(self, make: Callable[[int], object], timeout: float) -> Any:
        """Send a request (after the settles made before it) and wait for its REPLY; an
        ERROR raises, a lost session raises ``SessionLost``."""
        return self.client._request(make, timeout=timeout)

    def _commit_later(self, tx: tuple, answered: Callable[[Any], None]) -> None:
        """A transaction not waited for: sent now (``answered`` gets its answer on the
        client's I/O thread)."""
        self._ask_later(lambda req: wire.Transact(req, self.sub_id, *tx), answered)

    def _ask_later(self, make: Callable[[int], object], answered: Callable[[Any], None]) -> None:
        """Send a request and go on; ``answered`` gets its REPLY's data or the error (on
        the client's I/O thread)."""
        fut = self.client._request(make, wait=False)

        def done(f: Any) -> None:
            exc = f.exception()
            answered(exc if exc is not None else f.result())

        fut.add_done_callback(done)

    def _settle(self, op: str, msg: Message) -> None:
        """Queue a settle; wake the I/O thread only when it may have to act: on the first
        unsent settle (it then polls every ACK_DELAY), when the user has taken everything
        received so far, or at half the backlog (``Client._settle_due`` decides)."""
        first = not self.settle
        if self.unstarted is not None and self.unstarted.explicit:
            self.unstarted.settled(((msg.bookmark, msg.deliveries),))
        self.settle.append((op, msg.bookmark, msg._generation, next(self.client._order), msg.deliveries))
        if first or not self.local or len(self.settle) * 2 >= max(self.backlog, 1):
            self.client._wake()

    def replace(self, *, filter: str | None | type = ..., max_backlog: int | None = None, queue: str | None = None) -> int:
        """Change this subscription's filter, backlog or queue at once, keeping its leases.

        Returns the backlog granted (recomputed as on subscribe). ``filter=None``
        removes the filter; leaving it out keeps the current one.
        """
        new_filter = self.filter if filter is ... else filter
        new_backlog = max_backlog or self.max_backlog
        new_queue = queue or self.queue
        self.backlog = self.client.admin("replace", sub=self.sub_id, queue=new_queue, max_backlog=new_backlog,
                                         filter=new_filter)
        self.filter, self.max_backlog, self.queue = new_filter, new_backlog, new_queue  # type: ignore[assignment]
        return self.backlog

    def ack_unleased(self, bookmarks: list[int]) -> None:
        """Acknowledge messages this subscription was not given, by bookmark, on a queue
        with ``allow_ack_unleased`` (work done another way; a message still in a
        TargetQueueDepth queue's journal-only part). Bookmarks the queue cannot take
        are ignored by the server."""
        self.client._submit(wire.Ack(self.sub_id, [bookmark_arg(b) for b in bookmarks]))

    def _extend(self, msg: Message, ms: int) -> None:
        self.client._submit(wire.Extend(self.sub_id, [msg.bookmark], ms, [msg.deliveries]))

    def close(self) -> None:
        """Send the settles made so far and unsubscribe (what is unsettled goes back to
        the queue). Bounded, and quiet when the client is already gone or closed: a
        session that is lost ends the subscription on the dispatcher anyway."""
        if self.closed:
            return
        try:
            self.client._flush_and_wait(5.0)
        except ZqError:
            pass
        self.closed = True
        self.inbox.put(None)
        if self.client._serving:  # (else no session holds it: none will open it again, once it is gone from _subs)
            try:
                answer = self.client._request(lambda req: wire.Unsubscribe(req, self.sub_id), wait=False)
                # Waited for while the session lasts: one lost meanwhile answers nothing (its
                # request would wait for the next WELCOME), and ends the subscription anyway.
                deadline = time.monotonic() + 5
                while self.client._serving and time.monotonic() < deadline:
                    try:
                        answer.result(0.05)
                        break
                    except TimeoutError:
                        continue
            except ZqError:
                pass
        self.client._subs.pop(self.sub_id, None)

    def __enter__(self) -> "Subscription":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Replay(Subscription):
    """A journal replay: iterate to read; taking a message returns its window slot.

    No acks are needed (or possible): a replay has no queue semantics. After a
    reconnect it resumes after the last message taken.
    """

    def __init__(self, client: Session, sub_id: str, cmd: wire.Replay) -> None:
        super().__init__(client, sub_id, cmd.target, 0)
        self.cmd = cmd
        self.last: int | None = None

    def get(self, timeout: float | None = None) -> Message | None:
        msg = super().get(timeout)
        if msg is not None:
            self.last = msg.bookmark
            # window credit, not an ack of the message
            self.settle.append(("ack", msg.bookmark, msg._generation, next(self.client._order), 0))
            self.client._wake()
        return msg

    def resume_command(self, req: int) -> wire.Replay:
        start = self.cmd.start if self.last is None else self.last + 1
        start_ms = self.cmd.start_ms if self.last is None else None
        return msgspec.structs.replace(self.cmd, req=req, start=start, start_ms=start_ms)


