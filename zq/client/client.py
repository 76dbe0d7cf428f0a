"""Clients: ``zq.connect(endpoint)`` (sync) and ``zq.aio.connect`` (asyncio).

Theory of operation
-------------------
A DEALER socket belongs to one thread, and a worker's heartbeats must go on while
its code runs a long job. So each ``Client`` runs one I/O thread that owns the
socket. User threads hand it work through a deque and a wake-up pipe; it hands
deliveries back through per-subscription queues and replies through futures.

Batching falls out of that shape: every ``msg.ack()`` or ``publish_async()`` made
while the I/O thread was busy goes out in one frame on its next turn.

When the server goes silent for ``heartbeat x liveness`` (or says ``reset``), the I/O
thread reconnects with backoff, says HELLO, reopens every subscription and resends
every unconfirmed publish. Messages buffered from the old session are dropped (their
leases broke with it; the server delivers them again).
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any

import msgspec
import zmq

from zq import wire
from zq.core import limits
from zq.core.errors import LimitError, ZqError
from zq.core.settings import check_topic
from zq.client.messages import (
    _END,
    ACK_DELAY,
    Message,
    PublishBatch,
    PublishFuture,
    Replay,
    Subscription,
)
from zq.client.reclaim import reclaim_mode
from zq.client.session import (
    CLOSE_LINGER_MS,
    SEND_TIMEOUT_MS,
    ConnectionLost,
    Endpoints,
    Outgoing,
    Lost,
    NoticeLog,
    RetryLog,
    SessionLost,
    Watch,
    bookmark_arg,
    check_endpoint,
    close_session_socket,
    closing,
    connect_error,
    publish_fields,
    drain_frames,
    duration_arg,
    encode_command,
    error_from,
    open_session_socket,
    publish_chunks,
    send_settles,
    session_answer,
    session_lost,
    waiting_on,
    wire_item,
)
from zq.keys import client_curve

log = logging.getLogger("zq.client")

BULK_TIMEOUT_S = 600.0  # how long a bulk operator action may take (see Client.purge)
CLOSE_FLUSH_S = 5.0  # close: how long what was settled or sent before may take to leave
CLOSE_JOIN_S = 5.0  # close: how long the I/O thread may take to say BYE and close its socket


class Client:
    """A connection to a zq dispatcher (see module docstring)."""

    def __init__(
        self,
        endpoint: str,
        *,
        name: str | None = None,
        context: zmq.Context | None = None,
        connect_timeout: float | None = None,
        heartbeat_ms: int = 1000,
        liveness: int = 3,
        window: int = 16 * 64,
        key: Any = None,
        server_key: Any = None,
        wait_for_dispatcher: bool | None = None,
    ) -> None:
        """``key`` / ``server_key``: CurveZMQ keys for a dispatcher with ``[security]``
        (see ``zq.keys.client_curve``; default ``$ZQ_KEY`` / ``$ZQ_SERVER_KEY``).

        ``connect_timeout``: how long the first session may take to be answered
        (default 10 s), else ``ConnectionLost`` saying why. A handshake the dispatcher
        refuses (a key it does not allow, keys that do not match, plaintext against
        CurveZMQ) fails at once: ``zq.client.session.HandshakeRefused``. A connection
        refused outright (nothing listens there) fails within about half a second
        (``NotListening``), unless ``wait_for_dispatcher``: then it is tried again
        until the timeout, for a dispatcher that is still starting. By default it waits
        when a ``connect_timeout`` is given, and fails fast when none is. Once served,
        the client reconnects by itself, for as long as it takes."""
        if wait_for_dispatcher is None:
            wait_for_dispatcher = connect_timeout is not None
        if connect_timeout is None:
            connect_timeout = 10.0
        self._fail_fast = not wait_for_dispatcher
        self._retry_log = RetryLog(log)
        self._notices = NoticeLog(log)  # what held publishes wait for, said once per reason
        self._why: Lost | None = None  # why the session just ended, if session_lost said
        self._last_why: Lost | None = None  # ... and the last one that did (a connect timeout's error says it)
        self._watching: Watch | None = None  # what the current session's monitor said (read by a connect that timed out)
        self._curve = client_curve(key, server_key)
        self.endpoint = endpoint
        where = f"{socket.gethostname()}:{os.getpid()}"
        self.name = f"{where} {name}" if name else where  # operators see both (zq top, stats)
        self.ctx = context or zmq.Context.instance()
        self.heartbeat_ms = heartbeat_ms
        self.liveness = liveness
        self.generation = 0
        self.closed = False
        check_endpoint(endpoint)
        self.endpoints = Endpoints(endpoint)  # several: a leader and its standbys, one at a time
        self._reqs = itertools.count(1)
        self._sub_ids = itertools.count(1)
        # Every call's place in one order (requests, settles, sealed publish batches), so
        # the I/O thread sends frames in the order this client's calls were made.
        self._order = itertools.count(1)
        self._out: collections.deque[Outgoing] = collections.deque()
        self._pending: dict[int, tuple[Future, object]] = {}
        self._publishes: dict[int, tuple[Future | PublishBatch, bytes]] = {}  # req -> waiter, encoded PUBLISH
        self._broken: BaseException | None = None  # why the I/O thread died, if it did
        self.max_message_bytes = limits.MESSAGE_BYTES_MAX  # the dispatcher's, from WELCOME
        self._topics_checked: set[str] = set()
        self._subs: dict[str, Subscription] = {}
        self._window = window
        self._unconfirmed = 0  # messages published and not yet confirmed
        self._publish_lock = threading.Lock()
        # The dispatcher answers at most this many RANGE requests of one connection at
        # once (``limit`` beyond): threads sharing this client wait their turn here instead.
        self._range_slots = threading.BoundedSemaphore(limits.RANGES_WAITING_PER_CONNECTION)
        self._window_free = threading.Condition(self._publish_lock)
        self._open_batches: dict[str | tuple[str, int, int, int, int], PublishBatch] = {}  # by topic (and timing)
        self._sealed: collections.deque[PublishBatch] = collections.deque()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)  # (a full pipe has woken the thread already)
        self._woken = False
        self._pipe_lock = threading.Lock()  # the wake-up pipe is closed once, by close() or the I/O thread's end
        self._serving = False  # a welcomed session is open (what close's flush can wait for)
        self._welcome: Future = Future()
        self._flush_waiters: collections.deque[Future] = collections.deque()
        self._thread = threading.Thread(target=self._io_main, name="zq-client-io", daemon=True)
        self._thread.start()
        try:
            self._welcome.result(connect_timeout)
        except ConnectionLost:  # refused (a handshake, or nothing listening): said by the I/O thread
            self.close()
            raise
        except Exception as exc:
            self.close()
            said = self._last_why or waiting_on(self._watching)
            why = f" ({said})" if said else ""
            raise ConnectionLost(f"no answer from a zq dispatcher at {endpoint} within {connect_timeout}s{why}") from exc

    # ---------------------------------------------------------------- API

    @property
    def on_notice(self) -> Callable[[wire.Notice], object] | None:
        """Called with the dispatcher's ``wire.Notice`` when this client's publishes have
        waited a second or more for their confirmation (the standbys of ``replicas_ack``,
        or a flow-control queue over its limits): ``message`` says what they wait for.
        Once per reason while they wait, in the client's I/O thread (return quickly).
        None (the default): logged as a WARNING of logger ``zq.client``. The publishes
        go on waiting either way."""
        return self._notices.hook

    @on_notice.setter
    def on_notice(self, hook: Callable[[wire.Notice], object] | None) -> None:
        self._notices.hook = hook

    def publish(
        self,
        topic: str,
        data: bytes | str,
        *,
        group: str | None = None,
        priority: int | None = None,
        msg_id: str | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 30.0,
        delay: float | None = None,
        not_before: float | None = None,
        ttl: float | None = None,
        expires_at: float | None = None,
    ) -> int:
        """Publish one message; returns its bookmark once it is durable. ``delay``
        (seconds) or ``not_before`` (Unix seconds): it is not delivered before then.
        ``ttl`` (seconds) or ``expires_at`` (Unix seconds): still waiting then, it
        expires (reason ``ttl``) and is dead-lettered."""
        return self.publish_async(topic, data, group=group, priority=priority, msg_id=msg_id, headers=headers,
                                  delay=delay, not_before=not_before, ttl=ttl, expires_at=expires_at).result(timeout)

    def publish_async(
        self,
        topic: str,
        data: bytes | str,
        *,
        group: str | None = None,
        priority: int | None = None,
        msg_id: str | None = None,
        headers: dict[str, str] | None = None,
        delay: float | None = None,
        not_before: float | None = None,
        ttl: float | None = None,
        expires_at: float | None = None,
    ) -> PublishFuture:
        """A future of the bookmark; blocks only while the window of unconfirmed ones is full."""
        self._check_open()
        key: str | tuple[str, int, int, int, int] = topic
        if delay is not None or not_before is not None or ttl is not None or expires_at is not None:
            key = (topic, *publish_fields(delay, not_before, ttl, expires_at))
        if topic not in self._topics_checked:  # checked once per topic: this is the per-message path
            check_topic(topic)
            if len(self._topics_checked) < 1024:
                self._topics_checked.add(topic)
        item = wire_item(data, group, priority, msg_id, headers)
        if len(item[0]) > self.max_message_bytes:
            self._check_size(item)
        with self._publish_lock:
            while self._unconfirmed >= self._window:
                self._window_free.wait(1.0)
                self._check_open()
            self._unconfirmed += 1
            batch = self._open_batches.get(key)
            if batch is None or len(batch.items) >= limits.PUBLISH_BATCH_MAX or batch.size > limits.PUBLISH_BATCH_BYTES:
                if batch is not None:
                    self._seal(batch)
                batch = self._open_batches[key] = PublishBatch(topic, *key[1:]) if type(key) is tuple else PublishBatch(topic)
            batch.items.append(item)
            batch.size += len(item[0])
            fut = PublishFuture(batch, len(batch.items) - 1)
        self._wake()
        return fut

    def publish_many(self, topic: str, messages: Iterable[bytes | str], *, timeout: float = 60.0, **kw: Any) -> list[int]:
        """Publish a batch (one frame per ``PUBLISH_BATCH_MAX``); returns the bookmarks."""
        out: list[int] = []
        for f in self.publish_many_async(topic, messages, **kw):
            out.extend(f.result(timeout))
        return out

    def publish_many_async(self, topic: str, messages: Iterable[bytes | str], **kw: Any) -> list[Future]:
        """Like ``publish_many`` without waiting: one future of bookmarks per frame sent."""
        self._check_open()
        check_topic(topic)
        items = [wire_item(m, kw.get("group"), kw.get("priority"), None, kw.get("headers")) for m in messages]
        for item in items:
            self._check_size(item)
        timing = publish_fields(kw.get("delay"), kw.get("not_before"), kw.get("ttl"), kw.get("expires_at"))
        return [self._request(lambda req, c=chunk: wire.Publish(req, topic, c, *timing), wait=False)
                for chunk in publish_chunks(items)]

    def publish_records_async(self, topic: str, items: list[tuple[bytes, dict[str, str], str | None]]) -> list[Future]:
        """Pre-built ``(payload, headers, msg_id)`` messages (writers with their own ids);
        one future of bookmarks per frame sent."""
        self._check_open()
        return [self._request(lambda req, c=chunk: wire.Publish(req, topic, c), wait=False) for chunk in publish_chunks(items)]

    def subscribe(self, queue: str, *, max_backlog: int = 1, filter: str | None = None, timeout: float = 30.0,
                  sink: Callable[[list[Message]], None] | None = None,
                  reclaimable: bool | str = False) -> Subscription:
        """``sink``: deliveries go to this callable (on the I/O thread) instead of ``get``;
        set before the SUBSCRIBE leaves, so no delivery can miss it (the asyncio client).

        ``reclaimable``: messages delivered but not yet started may be taken back by the
        dispatcher for an idle worker, no delivery counted (``zq.client.reclaim``). True:
        taking a message starts it; ``"explicit"``: ``msg.start()`` does (and returns
        False for one given back meanwhile)."""
        self._check_open()
        reclaimable = reclaim_mode(reclaimable)
        sub = Subscription(self, f"s{next(self._sub_ids)}", queue, max_backlog, filter, reclaimable)
        sub.sink = sink
        self._subs[sub.sub_id] = sub
        try:
            answer = self._request(lambda req: wire.Subscribe(req, sub.sub_id, queue, max_backlog, filter,
                                                              bool(reclaimable)), timeout=timeout)
            sub.backlog, sub.group_header = answer.backlog, answer.group_header
        except BaseException:
            self._subs.pop(sub.sub_id, None)
            raise
        return sub

    def claim(
        self,
        queue: str,
        *,
        limit: int = 1,
        wait: float = 0.0,
        lease: float = 30.0,
        destructive: bool = False,
        filter: str | None = None,
    ) -> list[Message]:
        """Pull up to ``limit`` messages leased for ``lease`` seconds (Marconi claims).

        Waits up to ``wait`` seconds for at least one (long poll); returns what it got,
        possibly nothing. Ack, cancel, expire and extend them as pushed messages.
        ``destructive`` removes them as they are taken (an at-most-once batch get).
        """
        self._check_open()
        if not isinstance(limit, int) or not 1 <= limit <= limits.CLAIM_MAX:
            raise ValueError(f"claim limit must be 1..{limits.CLAIM_MAX}, got {limit!r}")
        wait_ms = duration_arg(wait, "claim wait", allow_zero=True)
        if wait_ms > limits.CLAIM_WAIT_MS_MAX:
            raise ValueError(f"claim wait must be at most {limits.CLAIM_WAIT_MS_MAX // 1000} s, got {wait!r}")
        lease_ms = duration_arg(lease, "claim lease")
        sub_id = f"claim:{queue}"
        sub = self._subs.get(sub_id)
        if sub is None:
            sub = self._subs[sub_id] = Subscription(self, sub_id, queue, 0)  # backlog 0: never resubscribed
        answer = self._request(
            lambda req: wire.Claim(req, sub_id, queue, limit, wait_ms, lease_ms, destructive, filter),
            timeout=wait + 30.0,
        )
        out = []
        for _ in range(answer["count"]):
            msg = sub.get(5.0)  # already received: the answer follows its DELIVER frames
            if msg is None:
                break
            out.append(msg)
        return out

    def replay(
        self,
        target: str,
        *,
        start: int | str = 0,
        since_ms: int | None = None,
        end: int | None = None,
        follow: bool = False,
        filter: str | None = None,
        window: int = 1000,
    ) -> Replay:
        """Read the journal as plain pub/sub: every message of a topic (or of a queue's
        topics, or of a ``^regex``) from ``start`` (a bookmark, 0 = the beginning,
        ``"now"``) or from ``since_ms`` (epoch ms), then live with ``follow``.

        Several readers each see every message, each with its own marker.
        """
        self._check_open()
        if start == "now":
            start = -1
        elif not isinstance(start, int):
            raise ValueError(f"start must be a bookmark or 'now', got {start!r}")
        sub_id = f"r{next(self._sub_ids)}"
        cmd = wire.Replay(0, sub_id, target, start, since_ms, end, follow, filter, window)
        sub = Replay(self, sub_id, cmd)
        self._subs[sub_id] = sub
        try:
            self._request(lambda req: msgspec.structs.replace(cmd, req=req), timeout=30)
        except BaseException:
            self._subs.pop(sub_id, None)
            raise
        return sub

    # ------------------------------------------------------- operators
    # (ack-filter, purge, move and redrive run in slices between everyone else's
    # requests, about 0.3-1.5 s per 100,000 messages: they wait up to BULK_TIMEOUT_S.)

    def admin(self, op: str, timeout: float = 30.0, **args: object) -> object:
        """Run an operator action (see ``zq.server.admin.OPERATIONS``); the methods below wrap it."""
        return self._request(lambda req: wire.Admin(req, op, args), timeout=timeout)

    def ack_filter(self, queue: str, filter: str) -> int:
        """Acknowledge every available message matching ``filter`` (leased ones too when
        the queue's ``leasing`` is ``shared``). Returns how many."""
        return self.admin("ack-filter", BULK_TIMEOUT_S, queue=queue, filter=filter)  # type: ignore[return-value]

    def purge(self, queue: str, *, filter: str | None = None, group: str | None = None) -> int:
        """Delete available messages: all, one group's, or a filter's matches."""
        return self.admin("purge", BULK_TIMEOUT_S, queue=queue, filter=filter, group=group)  # type: ignore[return-value]

    def move(self, queue: str, to: str, *, filter: str | None = None, group: str | None = None) -> int:
        """Republish available messages to topic ``to`` and remove them from ``queue``."""
        return self.admin("move", BULK_TIMEOUT_S, queue=queue, to=to, filter=filter, group=group)  # type: ignore[return-value]

    def redrive(self, queue: str, *, filter: str | None = None) -> int:
        """Send dead letters back to the topic they came from, with their id and headers."""
        return self.admin("redrive", BULK_TIMEOUT_S, queue=queue, filter=filter)  # type: ignore[return-value]

    def groups(self, queue: str, limit: int = 1000) -> list[dict]:
        """Groups of a queue with pending and in-flight counts, busiest first."""
        return self.admin("groups", queue=queue, limit=limit)  # type: ignore[return-value]

    def explain(self, queue: str, bookmark: int | None = None, *, msg_id: str | None = None,
                topic: str | None = None, history: int = 100) -> dict:
        """Why a message is where it is: ``state`` (leased, waiting, not-in-queue), the
        reasons (``why``: its lease and holder, its group's holder, a barrier, filters, no
        consumer with credit, what waits ahead), and its delivery ``history`` from the
        journal. Name it by ``bookmark``, or by ``msg_id`` (published to ``topic``,
        default the queue's name)."""
        args: dict[str, object] = {"queue": queue, "history": history}
        if bookmark is not None:
            args["bookmark"] = bookmark_arg(bookmark)
        if msg_id is not None:
            args["msg_id"] = msg_id
        if topic is not None:
            args["topic"] = topic
        return self.admin("explain", **args)  # type: ignore[return-value]

    def create_queue(self, name: str, **settings: object) -> dict:
        """Declare a queue at run time (settings as in zq.toml: ``lease="5s"``...).
        Declaring it again with the same settings succeeds; with others raises
        ``QueueExistsError`` (code ``exists``) naming each difference."""
        return self.admin("queue-create", name=name, **settings)  # type: ignore[return-value]

    def alter_queue(self, name: str, **settings: object) -> dict:
        """Change settings of a live run-time queue (as in zq.toml: ``lease="5s"``,
        ``backoff=["1s", "1m"]``; None puts one back to its default). Journaled: a
        restart keeps them. Returns ``{"changed": ["key: old -> new", ...], "settings":
        {...}}``; a setting that cannot change on a live queue is refused saying why."""
        return self.admin("queue-alter", name=name, **settings)  # type: ignore[return-value]

    def delete_queue(self, name: str) -> int:
        """Delete a run-time queue and what it holds; returns how many messages it held."""
        return self.admin("queue-delete", name=name)  # type: ignore[return-value]

    def read_range(
        self,
        kind: str = "messages",
        start: int = 0,
        end: int | None = None,
        target: str | None = None,
        limit: int = 65_536,
        timeout: float = 60.0,
    ) -> "wire.Records":
        """Stored records between two bookmarks (analytics; ``zq.server.ranges``): decode
        ``.blob`` with ``zq.wire.records.decode_messages`` / ``decode_events``; go on from
        ``.next`` until ``.done``."""
        deadline = time.monotonic() + timeout
        if not self._range_slots.acquire(timeout=timeout):
            raise TimeoutError(f"no RANGE answer within {timeout}s (this client's other threads held every slot)")
        try:
            pause = 0.005
            while True:
                left = max(0.001, deadline - time.monotonic())
                try:
                    return self._request(lambda req: wire.Range(req, kind, start, end, target, limit), timeout=left)
                except LimitError as exc:
                    # "still unread": this connection's earlier answers are on their way (the
                    # I/O thread reads them): ask again shortly, within the timeout.
                    if "still unread" not in str(exc) or time.monotonic() + pause > deadline:
                        raise
                time.sleep(pause)
                pause = min(pause * 2, 0.2)
        finally:
            self._range_slots.release()

    def bounds(self, at_ms: int | None = None, timeout: float = 10.0) -> dict:
        """``{"next_seq": n, "seq_at": s}``: every record below ``n`` is committed; ``s``
        is the first message published at or after ``at_ms``."""
        return self._request(lambda req: wire.Bounds(req, at_ms), timeout=timeout)

    def stats(self, timeout: float = 10.0, queues: list[str] | None = None) -> dict:
        """The dispatcher's figures: every queue's, up to ``server.queues_listed`` of
        them (the server lists at most 1,000: those holding the most messages), or only
        ``queues`` (names; at most 1,000; a name no queue has is left out)."""
        if queues is not None:
            if isinstance(queues, str) or not all(isinstance(n, str) for n in queues):
                raise TypeError("queues must be a list of queue names")
            queues = list(queues)
            if len(queues) > limits.STATS_QUEUES_MAX:
                raise ValueError(f"stats names at most {limits.STATS_QUEUES_MAX:,} queues, got {len(queues):,}")
        return self._request(lambda req: wire.Stats(req, queues), timeout=timeout)

    def peek(self, queue: str, limit: int = 100, filter: str | None = None, timeout: float = 10.0) -> list[dict]:
        """Waiting messages in delivery order, without leasing them (a read-only view):
        dicts of ``bookmark, topic, headers, data, deliveries, ts_ms`` (``data`` as on a
        ``Message``; the wire's PEEK answer calls it ``payload``), and ``not_before_ms``
        for a message waiting for its retry or its publish's delay."""
        rows = self._request(lambda req: wire.Peek(req, queue, limit, filter), timeout=timeout)
        for row in rows:
            row["data"] = row.pop("payload")
        return rows

    def query(
        self,
        queue: str,
        *,
        group_by: list[str] | None = None,
        aggregates: list[str] | None = None,
        filter: str | None = None,
        timeout: float = 30.0,
    ) -> list[dict]:
        """Counts, sums, averages, min / max over available messages, per group-by key.

        ``aggregates`` are ``count``, ``count(EXPR)``, ``sum(EXPR)``, ``avg(EXPR)``,
        ``min(EXPR)``, ``max(EXPR)``; rows are keyed by the expressions' texts.
        """
        answer = self._request(lambda req: wire.QueryCmd(req, queue, group_by or [], aggregates or [], filter), timeout=timeout)
        return answer["rows"]

    def queues(self, timeout: float = 10.0) -> list[dict]:
        return self._request(lambda req: wire.Queues(req), timeout=timeout)

    def close(self) -> None:
        """Send outstanding acks, say BYE, stop the I/O thread."""
        if self.closed:
            return
        try:
            self._flush_and_wait(timeout=CLOSE_FLUSH_S)
        except ZqError:
            pass
        self.closed = True
        self._wake()
        self._thread.join(CLOSE_JOIN_S)  # (it closes its socket and monitor as it ends)
        for sub in list(self._subs.values()):
            sub.closed = True
            sub.inbox.put(None)
        if not self._thread.is_alive():  # else it closes the pipe itself when it ends
            self._close_wake_pipe()

    def _close_wake_pipe(self) -> None:
        with self._pipe_lock:
            fds, self._wake_r, self._wake_w = (self._wake_r, self._wake_w), -1, -1
        for fd in fds:
            if fd >= 0:
                os.close(fd)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------ user-side plumbing

    def _check_open(self) -> None:
        if self._broken is not None:
            raise ConnectionLost(f"this client's I/O thread failed ({self._broken!r}); make a new client")
        if self.closed:
            raise ConnectionLost("client is closed")

    def _check_size(self, item: tuple[bytes, dict[str, str], str | None]) -> None:
        if len(item[0]) > self.max_message_bytes:
            raise LimitError(f"message of {len(item[0]):,} bytes is over the dispatcher's limit of "
                             f"{self.max_message_bytes:,} bytes (server.max_message_size)")

    def _seal(self, batch: PublishBatch) -> None:
        """A publish batch takes its place in the order of calls (caller holds the lock)."""
        batch.order = next(self._order)
        self._sealed.append(batch)

    def _enqueue(self, req: int, cmd: object, fut: Future | None) -> None:
        """Encode ``cmd`` here, in the caller's thread, so a value that cannot travel is
        the caller's error at once, never the I/O thread's; then queue it in order."""
        frame = encode_command(cmd)
        with self._publish_lock:  # what was published before this call leaves before it
            for batch in list(self._open_batches.values()):
                self._seal(batch)
            self._open_batches.clear()
            self._out.append(Outgoing(req, cmd, frame, fut, next(self._order)))

    def _wake(self) -> None:
        if not self._woken:
            self._woken = True
            with self._pipe_lock:  # (never a write to a descriptor closed, and maybe reused, meanwhile)
                if self._wake_w >= 0:
                    try:
                        os.write(self._wake_w, b"x")
                    except OSError:
                        pass

    def _submit(self, cmd: object) -> None:
        self._check_open()
        self._enqueue(0, cmd, None)
        self._wake()

    def _request(self, make: Callable[[int], object], *, timeout: float = 30.0, wait: bool = True) -> Any:
        self._check_open()
        fut: Future = Future()
        req = next(self._reqs)
        self._enqueue(req, make(req), fut)
        self._wake()
        if not wait:
            return fut
        return fut.result(timeout)

    def _flush_and_wait(self, timeout: float = 10.0) -> None:
        """Return once the I/O thread has sent everything settled or submitted so far; at
        once when no session is open (settles of a lost session are void, requests go
        after the next WELCOME), or when the I/O thread has ended."""
        if not self._serving or not self._thread.is_alive():
            return
        fut: Future = Future()
        self._flush_waiters.append(fut)
        if not self._serving or not self._thread.is_alive():
            # The session ended between the check above and the append: the I/O thread
            # may have answered every waiter already (it clears _serving, then answers
            # them), and nobody would answer this one (a close waited out its 5 s).
            try:
                self._flush_waiters.remove(fut)
            except ValueError:
                pass
            return
        self._wake()
        try:
            fut.result(timeout)
        except Exception as exc:
            raise ConnectionLost("could not flush to the dispatcher in time") from exc

    # ------------------------------------------------------------- I/O thread

    def _io_main(self) -> None:
        backoff = 0.05
        refused = 0  # endpoints refused in a row before the first session (see _first_failure)
        sock: zmq.Socket | None = None
        try:
            while not self.closed:
                sock = self._open_socket()
                self._why = None
                lost = self._serve(sock)
                sock, ended = None, sock
                close_session_socket(ended, linger=0 if lost else CLOSE_LINGER_MS)  # (its BYE, on a close)
                self._serving = False
                while self._flush_waiters:  # nothing more leaves on this session: don't keep them waiting
                    self._flush_waiters.popleft().set_result(None)
                if lost:  # its requests will never be answered (publishes are resent; the rest is the caller's)
                    unanswered = SessionLost(f"the session with {self.endpoints.current} was lost before an answer")
                    for req in list(self._pending):
                        self._reject(req, unanswered)
                if self.closed or not lost:
                    break
                if self._why is not None:
                    self._last_why = self._why
                refused = refused + 1 if self._why is not None and self._why.kind == "refused" else 0
                failure = self._first_failure(refused)
                if failure is not None:  # the caller's connect raises it; nothing more to try
                    self._welcome.set_exception(failure)
                    while not self.closed:
                        self._pause(1.0)
                    break
                self.endpoints.failed()
                self._pause(backoff * (0.5 + random.random()))
                backoff = min(backoff * 2, 2.0)
        except Exception as exc:  # a bug: every waiting and later call fails at once, naming it
            log.exception("zq client I/O thread crashed")
            self._broken = exc
        finally:
            self._serving = False
            if sock is not None:
                close_session_socket(sock)
            if self._broken is not None:
                self._fail_all(ConnectionLost(f"this client's I/O thread failed ({self._broken!r})"))
            else:
                self._fail_all(ConnectionLost("client closed"))
            if self.closed:
                self._close_wake_pipe()

    def _first_failure(self, refused: int) -> ConnectionLost | None:
        """The error that ends the first connect at once, if the last session says one:
        a security handshake refused, or (failing fast) every endpoint refused in a row."""
        why = self._why
        if why is None or self._welcome.done():
            return None
        if why.kind == "security" or (why.kind == "refused" and self._fail_fast and refused >= len(self.endpoints.all)
                                      and self.endpoints.zookeeper is None):
            return connect_error(self.endpoint, why)
        return None

    def _pause(self, seconds: float) -> None:
        """Wait before the next session; a close ends the wait (other wake-ups do not)."""
        deadline = time.monotonic() + seconds
        poller = zmq.Poller()
        poller.register(self._wake_r, zmq.POLLIN)
        while not self.closed and (left := deadline - time.monotonic()) > 0:
            if poller.poll(max(1, int(left * 1000))):
                self._woken = False
                try:
                    os.read(self._wake_r, 4096)
                except BlockingIOError:
                    pass

    def _open_socket(self) -> zmq.Socket:
        self.generation += 1
        for sub in list(self._subs.values()):
            if sub.unstarted is not None:
                sub.unstarted.reset()  # the old session's deliveries are redelivered
        sock = open_session_socket(self.ctx, self.endpoints.current, self.name, self._curve)  # type: ignore[arg-type]
        self._watching = sock.zq_watch
        return sock

    def _serve(self, sock: zmq.Socket) -> bool:
        """Run one session; True if it was lost (reconnect), False on close."""
        try:
            return self._serve_session(sock)
        except zmq.Again:  # a send not taken for SEND_TIMEOUT_MS: the dispatcher is gone
            log.warning("zq dispatcher at %s took no frame for %.1fs: reconnecting", self.endpoints.current,
                        SEND_TIMEOUT_MS / 1000)
            return True

    def _serve_session(self, sock: zmq.Socket) -> bool:
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(sock.zq_monitor, zmq.POLLIN)  # type: ignore[attr-defined] # a dropped connection wakes it
        poller.register(self._wake_r, zmq.POLLIN)
        hb = self.heartbeat_ms
        last_heard = last_sent = time.monotonic()
        welcomed = False
        while not self.closed:
            waiting = any(sub.settle for sub in self._subs.values())
            poller.poll(1 if waiting else hb // 2)
            self._woken = False
            try:
                os.read(self._wake_r, 4096)
            except BlockingIOError:
                pass
            now = time.monotonic()
            for frame in drain_frames(sock):
                last_heard = now
                outcome = self._on_frame(sock, frame)
                if outcome == "welcome":
                    welcomed = self._serving = True
                    self._retry_log.served()
                elif outcome == "reset":
                    return True
            if welcomed:
                if self._send_work(sock):
                    last_sent = now
            if now - last_sent >= hb / 1000:
                sock.send(wire.HEARTBEAT_FRAME)
                last_sent = now
            why = session_lost(sock, last_heard, hb * self.liveness / 1000, now,
                               refused_ends=self._fail_fast and not self._welcome.done())
            if why is not None:
                self._why = why
                if self._welcome.done():  # a session we had: worth a word (once per reason)
                    self._retry_log.note(self.endpoints.current, why, True)
                else:  # never connected yet: the caller's connect says it, once, in full
                    log.debug("no answer yet from %s (%s): trying again", self.endpoints.current, why)
                return True
        if welcomed:  # closing: what was settled or sent, then BYE, each send given a moment at most
            closing(sock)
            try:
                self._send_work(sock, force=True)
                sock.send(wire.encode(wire.Bye()))
            except zmq.Again:
                pass
        return False

    def _on_frame(self, sock: zmq.Socket, frame: bytes) -> str | None:
        """One frame from the dispatcher, handled by its type (``FRAME_HANDLERS``, as the
        server's ``HANDLERS``): "welcome" or "reset" when the session changed, else None."""
        try:
            msg = wire.server_decoder.decode(frame)
        except msgspec.MsgspecError as exc:
            log.error("undecodable frame from the dispatcher: %s", exc)
            return None
        handler = FRAME_HANDLERS.get(type(msg))
        return None if handler is None else handler(self, sock, msg)

    def _on_deliver(self, sock: zmq.Socket, msg: wire.DeliverRecords) -> None:
        sub = self._subs.get(msg.sub)
        if sub is None:
            return
        batch = list(zip(msg.records, msg.deliveries))
        sub.received += len(batch)
        if sub.unstarted is not None:
            sub.unstarted.delivered((r.seq, n) for r, n in batch)
        if sub.sink is not None:
            sub.sink([Message(r, n, sub, self.generation) for r, n in batch])
        else:
            sub.inbox.put((self.generation, batch))

    def _on_answer(self, sock: zmq.Socket, msg: Any) -> None:
        """CONFIRM (its bookmarks), REPLY (its data), RECORDS and SUBSCRIBED (themselves)."""
        t = type(msg)
        self._resolve(msg.req, msg.bookmarks if t is wire.Confirm else msg.data if t is wire.Reply else msg)

    def _on_notice(self, sock: zmq.Socket, msg: wire.Notice) -> None:
        """What this connection's held publishes wait for: said, once per reason."""
        self._notices.tell(msg)

    def _on_end(self, sock: zmq.Socket, msg: wire.End) -> None:
        sub = self._subs.get(msg.sub)
        if sub is not None:
            sub.inbox.put(_END)

    def _on_revoke(self, sock: zmq.Socket, msg: wire.Revoke) -> None:
        sub = self._subs.get(msg.sub)
        if sub is not None:  # (one closed meanwhile: its leases are going back anyway)
            back = ([], [], list(msg.bookmarks), list(msg.epochs))
            if sub.unstarted is not None:
                back = sub.unstarted.revoke(msg.bookmarks, msg.epochs)
            sock.send(wire.encode(wire.Release(msg.sub, *back)))

    def _on_refused(self, sock: zmq.Socket, msg: wire.Refused) -> None:
        sub = self._subs.get(msg.sub)
        if sub is not None:
            sub.refused += len(msg.bookmarks)
            if msg.reason == "lost":
                sub.lost += len(msg.bookmarks)
        log.debug("%s refused for %s: %s (%s)", msg.op, msg.sub, msg.bookmarks[:5], msg.reason)

    def _on_error(self, sock: zmq.Socket, msg: wire.Error) -> str | None:
        if session_answer(msg, self.endpoints) == "reset":  # a standby's not-leader, or the session ended
            return "reset"
        if msg.req:
            self._reject(msg.req, error_from(msg.code, msg.message))
        else:
            log.error("dispatcher error: %s: %s", msg.code, msg.message)
        return None

    def _on_welcome_frame(self, sock: zmq.Socket, msg: wire.Welcome) -> str:
        if session_answer(msg, self.endpoints) == "reset":  # a deposed leader
            return "reset"
        self.max_message_bytes = msg.max_message_bytes
        self._on_welcome(sock)
        return "welcome"

    def _on_welcome(self, sock: zmq.Socket) -> None:
        """A (re)established session: reopen subscriptions, resend unconfirmed work."""
        if not self._welcome.done():
            self._welcome.set_result(True)
        for sub in self._subs.values():
            if isinstance(sub, Replay) and not sub.ended and not sub.closed:
                req = next(self._reqs)
                self._pending[req] = (Future(), None)
                sub.settle.clear()
                sock.send(wire.encode(sub.resume_command(req)))
                continue
            if sub.backlog:  # it was open in an earlier session
                req = next(self._reqs)
                self._pending[req] = (Future(), None)
                sub.settle.clear()
                sub.received = sub.settles_taken = 0
                sock.send(wire.encode(wire.Subscribe(req, sub.sub_id, sub.queue, sub.max_backlog, sub.filter,
                                                     bool(sub.reclaimable))))
        for req, (_, frame) in list(self._publishes.items()):
            sock.send(frame)

    def _settle_due(self, sub: Subscription, now: float) -> bool:
        """Coalesce acks (ANCHORS rule 2: one ack frame per delivered frame).

        Send when the user has settled everything received, when half the backlog is
        waiting to be settled, or ``ACK_DELAY`` after the oldest unsent settle.
        """
        pending = len(sub.settle)
        if sub.received - sub.settles_taken - pending <= 0:
            return True
        if pending * 2 >= max(sub.backlog, 1):
            return True
        if not sub.settle_since:
            sub.settle_since = now
        return now - sub.settle_since >= ACK_DELAY

    def _send_work(self, sock: zmq.Socket, force: bool = False) -> bool:
        # Waiters present now had their work queued before this pass: it sends it all.
        waiters = [self._flush_waiters.popleft() for _ in range(len(self._flush_waiters))]
        force = force or bool(waiters)
        sent = False
        while self._out:
            out = self._out.popleft()
            sent |= self._send_before(sock, out.order)
            if out.fut is not None:
                if type(out.cmd) is wire.Publish:
                    self._publishes[out.req] = (out.fut, out.frame)
                else:
                    self._pending[out.req] = (out.fut, out.cmd)
            sock.send(out.frame)
            sent = True
        with self._publish_lock:
            batches = list(self._sealed) + list(self._open_batches.values())
            self._sealed.clear()
            self._open_batches.clear()
        for batch in batches:
            sent |= self._send_batch(sock, batch)
        now = time.monotonic()
        for sub in list(self._subs.values()):
            if sub.settle and (force or self._settle_due(sub, now)):
                sent |= self._send_settles(sock, sub)
        for fut in waiters:
            fut.set_result(None)
        return sent

    def _send_before(self, sock: zmq.Socket, order: int) -> bool:
        """Send the publish batches sealed and the settles made before call ``order``."""
        sent = False
        with self._publish_lock:
            batches = []
            while self._sealed and self._sealed[0].order < order:
                batches.append(self._sealed.popleft())
        for batch in batches:
            sent |= self._send_batch(sock, batch)
        for sub in list(self._subs.values()):
            if sub.settle and sub.settle[0][3] < order:
                sent |= self._send_settles(sock, sub, order)
        return sent

    def _send_batch(self, sock: zmq.Socket, batch: PublishBatch) -> bool:
        req = next(self._reqs)
        frame = wire.encode(wire.Publish(req, batch.topic, batch.items, batch.delay_ms,  # items were checked by wire_item
                                         batch.not_before_ms, batch.ttl_ms, batch.expires_at_ms))
        self._publishes[req] = (batch, frame)
        sock.send(frame)
        return True

    def _send_settles(self, sock: zmq.Socket, sub: Subscription, before: int | None = None) -> bool:
        current: list[tuple[str, int, int]] = []
        sub.settle_since = 0.0
        settle = sub.settle
        while settle and (before is None or settle[0][3] < before):
            op, bookmark, generation, _, epoch = settle.popleft()
            sub.settles_taken += 1
            if generation == self.generation:
                current.append((op, bookmark, epoch))
        return send_settles(sock, sub.sub_id, current)

    def _resolve(self, req: int, value: Any) -> None:
        entry = self._publishes.pop(req, None)
        if entry is not None:
            self._publish_done(entry[0], value, None)
            if not self._publishes:
                self._notices.confirmed()  # nothing waits now: a later wait is told again
            return
        pending = self._pending.pop(req, None)
        if pending is not None and pending[0] is not None and not pending[0].done():
            pending[0].set_result(value)

    def _reject(self, req: int, exc: BaseException) -> None:
        entry = self._publishes.pop(req, None)
        if entry is not None:
            self._publish_done(entry[0], None, exc)
            if not self._publishes:
                self._notices.confirmed()
            return
        pending = self._pending.pop(req, None)
        if pending is not None and pending[0] is not None and not pending[0].done():
            pending[0].set_exception(exc)

    def _publish_done(self, target: "Future | PublishBatch", value: Any, exc: BaseException | None) -> None:
        if isinstance(target, PublishBatch):
            with self._publish_lock:
                self._unconfirmed -= len(target.items)
                self._window_free.notify_all()
            target.settle(value, exc)
        elif target is not None and not target.done():
            if exc is None:
                target.set_result(value)
            else:
                target.set_exception(exc)

    def _fail_all(self, exc: BaseException) -> None:
        for req in list(self._publishes):
            self._reject(req, exc)
        for req in list(self._pending):
            self._reject(req, exc)
        while self._out:
            fut = self._out.popleft().fut
            if fut is not None and not fut.done():
                fut.set_exception(exc)
        with self._publish_lock:
            batches = list(self._sealed) + list(self._open_batches.values())
            self._sealed.clear()
            self._open_batches.clear()
            self._window_free.notify_all()
        for batch in batches:
            batch.settle(None, exc)
        if not self._welcome.done():
            self._welcome.set_exception(exc)
        while self._flush_waiters:
            self._flush_waiters.popleft().set_exception(exc)


# The dispatcher's frames by type (a HEARTBEAT needs nothing: hearing it was the point).
FRAME_HANDLERS: dict[type, Callable[[Client, zmq.Socket, Any], str | None]] = {
    wire.DeliverRecords: Client._on_deliver,
    wire.Confirm: Client._on_answer,
    wire.Records: Client._on_answer,
    wire.Subscribed: Client._on_answer,
    wire.Reply: Client._on_answer,
    wire.End: Client._on_end,
    wire.Revoke: Client._on_revoke,
    wire.Refused: Client._on_refused,
    wire.Error: Client._on_error,
    wire.Welcome: Client._on_welcome_frame,
    wire.Notice: Client._on_notice,
}


def connect(endpoint: str | None = None, **kw: Any) -> Client:
    """Connect to a dispatcher (default: ``$ZQ_ENDPOINT`` or ``tcp://127.0.0.1:7780``)."""
    from zq.wire import DEFAULT_ENDPOINT

    return Client(endpoint or os.environ.get("ZQ_ENDPOINT") or DEFAULT_ENDPOINT, **kw)
