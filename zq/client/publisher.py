"""A single-threaded publisher: the calling thread owns the socket (``zq.Publisher``).

Why it exists
-------------
``zq.Client`` hands every publish from the caller's thread to its I/O thread: a pipe
write, a wake-up and a GIL transfer, in a process that holds two threads. On the
2-core machine the bench runs on, that hop is most of zq's latency tail: a dispatcher
between raw sockets delivers at p99 ~450 us at 2,000 msg/s, and ~2 ms with
``zq.Client`` publishing (docs/performance.md). ``Publisher`` sends from the caller's
thread and waits there for the confirmation; nothing runs between calls.

The contract that buys it: the session lives only while you call in. A publisher idle
for longer than the dispatcher's dead-peer window loses its session; the next call
finds out (its connection dropped, an error frame, or silence: the rule every client
follows, ``zq.client.session.session_lost``) and opens a new one. A publish is resent after
a lost session until it is confirmed (at-least-once; give messages ids to have the
dispatcher drop the repeats).
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable
from typing import Any

import msgspec
import zmq

from zq import wire
from zq.client.session import (
    CLOSE_LINGER_MS,
    ConnectionLost,
    Endpoints,
    Lost,
    NoticeLog,
    check_target,
    close_session_socket,
    connect_error,
    publish_fields,
    error_from,
    open_session,
    publish_chunks,
    session_answer,
    session_dropped,
    session_lost,
    waiting_on,
    watch,
    wire_item,
)
from zq.core import limits
from zq.core.errors import LimitError, ZqError
from zq.core.settings import check_topic
from zq.keys import client_curve

__all__ = ["Publisher"]

log = logging.getLogger("zq.publisher")


class Publisher:
    """Publish from the calling thread; every call returns once its messages are durable.

    >>> with zq.Publisher("tcp://127.0.0.1:7780") as p:  # doctest: +SKIP
    ...     bookmark = p.publish("jobs", b"payload")

    ``endpoint`` may be an embedded ``zq.Dispatcher`` itself: then each call steps the
    dispatcher in the calling thread (no socket, no hand-off; zq.server.local).
    """

    def __init__(self, endpoint: Any, *, name: str | None = None, context: zmq.Context | None = None,
                 connect_timeout: float | None = None, window: int = 16, key: object = None,
                 server_key: object = None, liveness: int = 3, wait_for_dispatcher: bool | None = None) -> None:
        """``connect_timeout``, ``wait_for_dispatcher``: as ``zq.Client`` (a refused
        handshake fails at once; nothing listening fails within about half a second,
        unless waiting for a dispatcher, by default when a ``connect_timeout`` is given)."""
        check_target(endpoint)
        if wait_for_dispatcher is None:
            wait_for_dispatcher = connect_timeout is not None
        self._fail_fast = not wait_for_dispatcher
        self._served = False  # a WELCOME came: from then on, a lost session is opened again
        self._curve = client_curve(key, server_key)
        self.endpoint = endpoint
        self._endpoints = Endpoints(endpoint)  # several: a leader and its standbys, one at a time
        self.max_message_bytes = limits.MESSAGE_BYTES_MAX  # the dispatcher's, from WELCOME
        where = f"{socket.gethostname()}:{os.getpid()}"
        self.name = f"{where} {name}" if name else where
        self.ctx = context or zmq.Context.instance()
        self.window = max(1, window)  # frames in flight in publish_many
        self.heartbeat_ms = 1000  # until WELCOME says
        self.liveness = liveness  # heartbeats of silence that end a session, as zq.Client and zq.Worker
        self.closed = False
        self.generation = 0  # sessions opened so far
        self._reqs = itertools.count(1)
        self._sock: Any = None  # a zmq.Socket, or an in-process link to an embedded dispatcher
        self._poller: Any = None
        self._last_sent = 0.0
        self._notices = NoticeLog(log)  # what a held publish waits for, said once per reason and call
        try:
            self._open_session(10.0 if connect_timeout is None else connect_timeout)
        except BaseException:
            self.close()
            raise

    # ---------------------------------------------------------------- API

    def publish(self, topic: str, data: bytes | str, *, group: str | None = None, priority: int | None = None,
                msg_id: str | None = None, headers: dict[str, str] | None = None, timeout: float = 30.0,
                delay: float | None = None, not_before: float | None = None, ttl: float | None = None,
                expires_at: float | None = None) -> int:
        """Publish one message; returns its bookmark once it is durable. ``delay``
        (seconds) or ``not_before`` (Unix seconds): it is not delivered before then.
        ``ttl`` (seconds) or ``expires_at`` (Unix seconds): still waiting then, it
        expires (reason ``ttl``) and is dead-lettered."""
        return self._publish(topic, [wire_item(data, group, priority, msg_id, headers)], timeout,
                             publish_fields(delay, not_before, ttl, expires_at))[0]

    def publish_many(self, topic: str, messages: Iterable[bytes | str], *, timeout: float = 60.0,
                     **kw: object) -> list[int]:
        """Publish a batch (frames of up to ``PUBLISH_BATCH_MAX``, ``window`` of them in
        flight); returns the bookmarks in order."""
        items = [wire_item(m, kw.get("group"), kw.get("priority"), None, kw.get("headers")) for m in messages]  # type: ignore[arg-type]
        return self._publish(topic, items, timeout, publish_fields(kw.get("delay"), kw.get("not_before"), kw.get("ttl"),
                                                                   kw.get("expires_at")))

    @property
    def on_notice(self) -> Callable[[wire.Notice], object] | None:
        """As ``zq.Client.on_notice``: called (in the publishing thread) with the
        dispatcher's ``wire.Notice`` when a publish has waited a second or more for its
        confirmation, once per reason per call; None (the default): logged as a WARNING
        of logger ``zq.publisher``. The call goes on waiting either way."""
        return self._notices.hook

    @on_notice.setter
    def on_notice(self, hook: Callable[[wire.Notice], object] | None) -> None:
        self._notices.hook = hook

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.send(wire.encode(wire.Bye()), zmq.NOBLOCK)
            except (zmq.ZMQError, ZqError):  # ZqError: an embedded dispatcher that stopped first
                pass
            close_session_socket(sock, linger=CLOSE_LINGER_MS)

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ internals

    def _publish(self, topic: str, items: list, timeout: float,
                 delay: tuple[int, int, int, int] = (0, 0, 0, 0)) -> list[int]:
        if self.closed:
            raise ConnectionLost("publisher is closed")
        check_topic(topic)
        for item in items:
            if len(item[0]) > self.max_message_bytes:
                raise LimitError(f"message of {len(item[0]):,} bytes is over the dispatcher's limit of "
                                 f"{self.max_message_bytes:,} bytes (server.max_message_size)")
        deadline = time.monotonic() + timeout
        chunks = list(publish_chunks(items))
        results: list[list[int] | None] = [None] * len(chunks)
        self._notices.confirmed()  # (a new wait: told again)
        while True:
            try:
                self._send_and_wait(topic, chunks, results, deadline, delay)
                return [b for r in results for b in r]  # type: ignore[union-attr]
            except _SessionLost:
                if time.monotonic() >= deadline:
                    raise ConnectionLost(f"publish to {self.endpoint} not confirmed within {timeout}s") from None
                self._endpoints.failed()
                self._open_session(max(0.1, deadline - time.monotonic()))  # unconfirmed chunks go again

    def _send_and_wait(self, topic: str, chunks: list, results: list, deadline: float,
                       delay: tuple[int, int, int, int] = (0, 0, 0, 0)) -> None:
        """Send the chunks not yet confirmed, ``window`` at a time; wait for each confirm."""
        sock = self._sock
        assert sock is not None
        if session_dropped(sock):  # (while idle: its dispatcher died, or stepped down)
            raise _SessionLost
        todo = [i for i, r in enumerate(results) if r is None]
        inflight: dict[int, int] = {}  # req -> chunk index
        while todo or inflight:
            while todo and len(inflight) < self.window:
                i = todo.pop(0)
                req = next(self._reqs)
                self._send(wire.encode(wire.Publish(req, topic, chunks[i], *delay)))
                inflight[req] = i
            reply = self._next_reply(deadline)
            t = type(reply)
            if t is wire.Confirm and reply.req in inflight:  # type: ignore[attr-defined]
                results[inflight.pop(reply.req)] = reply.bookmarks  # type: ignore[attr-defined]
            elif session_answer(reply, self._endpoints) == "reset":
                raise _SessionLost
            elif t is wire.Error and reply.req in inflight:  # type: ignore[attr-defined]
                raise error_from(reply.code, reply.message)  # type: ignore[attr-defined]
            elif t is wire.Notice:  # what the held confirmations wait for: said, and waited for
                self._notices.tell(reply)  # type: ignore[arg-type]

    def _send(self, frame: bytes) -> None:
        try:
            self._sock.send(frame)
        except zmq.Again:  # not taken for SEND_TIMEOUT_MS: the dispatcher is gone
            raise _SessionLost from None
        self._last_sent = time.monotonic()

    def _window_s(self) -> float:
        return self.heartbeat_ms * self.liveness / 1000

    def _next_reply(self, deadline: float) -> object:
        """The next frame from the dispatcher; heartbeats while waiting; _SessionLost
        when the session is lost (``session_lost``: a dropped connection, or silence
        for the dead-peer window)."""
        sock = self._sock
        assert sock is not None
        hb = self.heartbeat_ms / 1000
        silent_since = time.monotonic()
        while True:
            now = time.monotonic()
            if now >= deadline or session_lost(sock, silent_since, self._window_s(), now):
                raise _SessionLost
            if now - self._last_sent >= hb / 2:
                self._send(wire.HEARTBEAT_FRAME)
            wait = min(hb / 2, deadline - now)
            frame = self._recv(wait)
            if frame is not None:
                msg = decoded(frame)
                if msg is not None:
                    return msg

    def _recv(self, wait: float) -> bytes | None:
        """A frame, waiting up to ``wait`` seconds (a dropped connection ends the wait)."""
        if self._poller.poll(max(1, int(wait * 1000))):
            try:
                return self._sock.recv(zmq.NOBLOCK)  # type: ignore[no-any-return]
            except zmq.Again:
                pass  # (the monitor woke us)
        return None

    def _open_session(self, timeout: float) -> None:
        """A session with a dispatcher that serves. Each attempt ends when the session is
        lost (``session_lost``: no WELCOME within the dead-peer window, or the connection
        dropped) and the next goes to the next endpoint (with one endpoint, the same one,
        on a new connection); a standby's ``not-leader`` sends us to the leader it names."""
        deadline = time.monotonic() + timeout
        refused = 0  # sessions refused in a row, before the first
        last: Lost | None = None  # why the last attempt that said was lost (a timeout's error says it)
        while True:
            if time.monotonic() >= deadline:
                said = last or waiting_on(watch(self._sock))
                said = f" ({said})" if said else ""
                raise ConnectionLost(f"no answer from a zq dispatcher at {self.endpoint} within {timeout:.1f}s{said}")
            why = self._try_session(deadline)
            if why is None:
                self._served = True
                return
            if isinstance(why, Lost):
                last = why
            kind = why.kind if isinstance(why, Lost) else ""
            if not self._served:  # a refused handshake, or every endpoint refused (failing fast), ends it
                refused = refused + 1 if kind == "refused" else 0
                if kind == "security" or (kind == "refused" and self._fail_fast and self._endpoints.zookeeper is None
                                          and refused >= len(self._endpoints.all)):
                    raise connect_error(self.endpoint, why)  # type: ignore[arg-type]
            self._endpoints.failed()

    def _try_session(self, deadline: float) -> str | None:
        """One session: None once welcomed, else why not (a ``Lost`` from
        ``session_lost``, "reset", or "timeout")."""
        if self._sock is not None:
            sock, self._sock = self._sock, None
            close_session_socket(sock)
        sock, self._poller = open_session(self._endpoints.current, self.ctx, self.name, self._curve)
        self._sock = sock
        self.generation += 1
        self._last_sent = started = time.monotonic()
        while True:
            now = time.monotonic()
            if now >= deadline:
                return "timeout"
            why = session_lost(sock, started, self._window_s(), now, refused_ends=self._fail_fast and not self._served)
            if why is not None:
                return why
            frame = self._recv(min(deadline - now, self._window_s()))
            if frame is None:
                continue
            msg = decoded(frame)
            answer = session_answer(msg, self._endpoints)
            if answer == "welcome":
                self.heartbeat_ms = msg.heartbeat_ms  # type: ignore[attr-defined]
                self.max_message_bytes = msg.max_message_bytes  # type: ignore[attr-defined]
                return None
            if answer == "reset":
                return "reset"


def decoded(frame: bytes) -> object:
    """A dispatcher's frame, or None (logged) for one this client cannot read: a frame
    it does not know is skipped, never the end of a publish."""
    try:
        return wire.server_decoder.decode(frame)
    except msgspec.MsgspecError as exc:
        log.error("undecodable frame from the dispatcher: %s", str(exc)[:200])
        return None


class _SessionLost(Exception):
    """The dispatcher ended our session or went silent: open a new one, resend."""
