"""A single-threaded consumer: the calling thread owns the socket (``zq.Worker``).

Why it exists
-------------
``zq.Client`` runs an I/O thread, so that publishes, heartbeats and acks flow while
the user's code runs. The price is a hand-off between threads for every delivery
frame and every ack frame. On the 2-core machine the bench runs on, each hand-off is
a wake-up of a sleeping thread and a GIL transfer, and the standard workload showed
about 0.4 context switches per message in the workers: their CPU, not the
dispatcher, capped throughput. A worker process that only consumes one queue needs
none of that. Here ``get`` reads the socket itself, and acks wait in a list until the
worker is about to wait (or half its backlog is waiting to be settled), then leave as
one frame. That is the same batching the raw-relay ceiling uses (one ack frame per
frame taken), with no extra thread.

The contract that buys it: the session lives only while you call in. ``get`` /
``get_many`` send heartbeats while they wait, but a task that runs longer than the
dispatcher's dead-peer window (``server.heartbeat`` × ``heartbeat_liveness``, 3 s by
default) without calling back makes the dispatcher end the session and re-queue its
messages. For long tasks use ``zq.Client``, whose I/O thread heartbeats for you, or
call ``msg.extend`` / ``worker.heartbeat()`` between steps.

Session losses (dispatcher restart, a dead-peer verdict, a network cut) are handled
here: the worker reconnects, says HELLO, subscribes again, and drops what the old
session had delivered and not settled; the dispatcher redelivers those.
"""

from __future__ import annotations

import collections
import itertools
import logging
import math
import os
import socket
import time
from collections.abc import Iterable, Iterator
from typing import Any

import msgspec
import zmq

from zq import wire
from zq.client.messages import Message, MessageStream, cancel_messages, count_verdicts
from zq.client.reclaim import Unstarted, reclaim_mode
from zq.client.session import (
    NOBLOCK,
    CLOSE_LINGER_MS,
    ConnectionLost,
    Endpoints,
    Lost,
    TX_BYTES_MAX,
    TX_TOPICS_MAX,
    TXS_MAX,
    RetryLog,
    SessionLost,
    check_target,
    close_session_socket,
    closing,
    connect_error,
    error_from,
    open_session,
    readable,
    results_by_bookmark,
    send_settles,
    session_answer,
    session_lost,
    settle_command,
    tx_size,
    waiting_on,
    watch,
)
from zq.core import limits
from zq.core.errors import ZqError
from zq.keys import client_curve

log = logging.getLogger("zq.worker")

def tx_frames(txs: list[tuple[tuple, Any]]) -> Iterator[list[tuple[tuple, Any]]]:
    """Transactions (each ``((op, bookmarks, epochs, outputs, delay_ms, error), answered)``)
    cut into TXS frames within the dispatcher's limits: transactions, bookmarks, messages,
    topics and bytes per frame."""
    frame: list[tuple[tuple, Any]] = []
    bookmarks = messages = size = 0
    topics: set[str] = set()
    for tx in txs:
        (_, seqs, _, outputs, _, _), _ = tx
        count, nbytes = tx_size(outputs)
        named = {topic for topic, _ in outputs}
        if frame and (len(frame) >= TXS_MAX or bookmarks + len(seqs) > limits.ACK_BATCH_MAX
                      or messages + count > limits.PUBLISH_BATCH_MAX or size + nbytes > TX_BYTES_MAX
                      or len(topics | named) > TX_TOPICS_MAX):
            yield frame
            frame, bookmarks, messages, size, topics = [], 0, 0, 0, set()
        frame.append(tx)
        bookmarks, messages, size = bookmarks + len(seqs), messages + count, size + nbytes
        topics |= named
    if frame:
        yield frame


class Worker(MessageStream):
    """Consume one queue from the calling thread (see module docstring).

    >>> with zq.Worker("tcp://127.0.0.1:7780", "jobs", max_backlog=16) as w:  # doctest: +SKIP
    ...     for msg in w:
    ...         msg.ack()

    ``endpoint`` may be an embedded ``zq.Dispatcher`` itself: then settles step the
    dispatcher in this thread, and deliveries arrive without a socket (zq.server.local).
    """

    def __init__(
        self,
        endpoint: Any,
        queue: str,
        *,
        max_backlog: int = 16,
        filter: str | None = None,
        name: str | None = None,
        context: zmq.Context | None = None,
        connect_timeout: float = 10.0,
        liveness: int = 3,
        key: object = None,
        server_key: object = None,
        reclaimable: bool | str = False,
        wait_for_dispatcher: bool = True,
    ) -> None:
        """``reclaimable``: as ``zq.Client.subscribe`` (deliveries not started may be
        taken back for an idle worker; True: taking starts; "explicit": ``msg.start()``).

        ``connect_timeout``: how long the first session may take to be answered, else
        ``ConnectionLost`` saying why. A worker may start before its dispatcher: a
        connection refused (nothing listening yet) is tried again until then, said once
        in the log; ``wait_for_dispatcher=False`` fails within about half a second
        instead (``zq.client.session.NotListening``). A handshake the dispatcher refuses
        (keys) fails at once (``HandshakeRefused``)."""
        check_target(endpoint)
        self.reclaimable = reclaim_mode(reclaimable)
        self.unstarted = Unstarted(reclaimable == "explicit") if reclaimable else None
        self._curve = client_curve(key, server_key)
        self.endpoint = endpoint
        self._endpoints = Endpoints(endpoint)  # several: a leader and its standbys, one at a time
        self.queue = queue
        self.max_backlog = max_backlog
        self.filter = filter
        where = f"{socket.gethostname()}:{os.getpid()}"
        self.name = f"{where} {name}" if name else where
        self.ctx = context or zmq.Context.instance()
        self.liveness = liveness
        self.sub_id = "w1"
        self.backlog = 0  # granted by the dispatcher
        self.group_header: str | None = "group"  # the queue's, from SUBSCRIBED (what Message.group reads)
        self.refused = 0  # settles the dispatcher did not apply (any result but ok)
        self.lost = 0  # of them: deliveries whose lease had ended (the work went to someone again)
        self._replies: dict[int, object] = {}  # answers to settles that wait (req -> REPLY data)
        self._asking: set[int] = set()  # requests whose ERROR is their waiter's to raise (``_ask``)
        self._later: dict[int, Any] = {}  # requests not waited for: req -> what to do with the answer (``_ask_later``)
        self._txs: list[tuple[tuple, Any]] = []  # transactions not waited for, to send at the next flush
        self.generation = 0
        self.closed = False
        self.heartbeat_ms = 1000  # until WELCOME says
        self._reqs = itertools.count(1)
        self._subscribe_req = 0
        self._local: collections.deque[Message] = collections.deque()
        self._settles: list[tuple[str, int, int]] = []  # (op, bookmark, epoch) of this session
        self._sock: Any = None  # a zmq.Socket, or an in-process link to an embedded dispatcher
        self._poller: Any = None
        self._last_heard = self._last_sent = 0.0
        self._wait = wait_for_dispatcher
        self._served = False  # a WELCOME came: from then on, every loss is reconnected
        self._refused = 0  # sessions refused in a row before the first (NotListening when every endpoint was)
        self._last_why: str | None = None
        self._retry_log = RetryLog(log)
        self._open_session()
        deadline = time.monotonic() + connect_timeout
        try:
            while not self.backlog:
                if time.monotonic() >= deadline:
                    said = self._last_why or waiting_on(watch(self._sock))
                    why = f" ({said})" if said else ""
                    raise ConnectionLost(f"no answer from a zq dispatcher at {endpoint} within {connect_timeout}s{why}")
                self._pump(deadline)
        except BaseException:
            self.close()
            raise

    # ---------------------------------------------------------------- API

    def get(self, timeout: float | None = None) -> Message | None:
        """The next message, or None when ``timeout`` seconds pass without one (kept to
        within about a millisecond: the socket's wait counts whole milliseconds, rounded
        up). Settles made so far leave before it waits: the credit they free brings the
        next ones."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            while not self._local:
                if self.closed:
                    raise StopIteration
                self._flush()
                self._pump(deadline)
                if not self._local and deadline is not None and time.monotonic() >= deadline:
                    return None
            msg = self._local.popleft()
            if self.unstarted is None or self.unstarted.take(msg.bookmark, msg.deliveries):
                return msg  # (else given back before it was taken: another worker has it)

    def get_many(self, max_messages: int, timeout: float | None = None) -> list[Message]:
        """Up to ``max_messages``: waits (up to ``timeout``) for the first, then takes what
        has already arrived without waiting for more. Empty on timeout."""
        first = self.get(timeout)
        if first is None:
            return []
        if len(self._local) < max_messages - 1:
            self._pump(0.0)  # frames already here, without waiting
        out = [first]
        local, unstarted = self._local, self.unstarted
        while local and len(out) < max_messages:
            msg = local.popleft()
            if unstarted is None or unstarted.take(msg.bookmark, msg.deliveries):
                out.append(msg)
        return out

    def ack_many(self, messages: Iterable[Message], *, wait: bool = False) -> dict[int, str] | None:
        """Acknowledge several messages; they leave as one frame. With ``wait=True``,
        wait for the verdicts: bookmark -> ``ok`` / ``lost`` / ``done`` / ``unknown``."""
        return self._settle_many("ack", messages, wait)

    def cancel_many(self, messages: Iterable[Message], *, wait: bool = False, delay: float | None = None,
                    error: str | BaseException | None = None) -> dict[int, str] | None:
        """Cancel several messages: each goes again after the queue's backoff, or after
        ``delay`` seconds (0: at once); ``error``: they failed (see ``Message.cancel``).
        With a delay or an error they are sent at once and answered, like ``wait=True``."""
        return cancel_messages(self, messages, wait, delay, error)

    def heartbeat(self) -> None:
        """Tell the dispatcher this worker is alive (and send waiting settles), without
        waiting for anything: call it during a long task."""
        self._flush()
        self._pump(0.0)

    def close(self) -> None:
        """Send the settles made so far and leave; unsettled messages return to the queue."""
        if self.closed:
            return
        self.closed = True
        sock, self._sock = self._sock, None
        if sock is None:
            return
        closing(sock)
        try:
            self._send_settles(sock)
            if self._txs:  # transactions not waited for go before the BYE (their answers are not read)
                self._send_txs(sock)
            sock.send(wire.encode(wire.Bye()), zmq.NOBLOCK)
        except (zmq.ZMQError, ZqError):  # ZqError: an embedded dispatcher that stopped first
            pass
        close_session_socket(sock, linger=CLOSE_LINGER_MS)

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------- what Message calls back

    def _settle(self, op: str, msg: Message) -> None:
        self._settle_many(op, (msg,))

    def _settle_many(self, op: str, messages: Iterable[Message], wait: bool = False) -> dict[int, str] | None:
        """Settles wait until the worker is about to wait, or until half the backlog is
        waiting to be settled: the dispatcher can refill while the rest is worked on."""
        if self.unstarted is not None and self.unstarted.explicit:
            messages = list(messages)
            self.unstarted.settled((m.bookmark, m.deliveries) for m in messages)
        if wait:
            return self._settle_wait(op, [m for m in messages if m.deliveries])
        gen = self.generation  # a message of a session that is gone is redelivered anyway: not sent, counted lost
        stale = 0
        for m in messages:
            if m.deliveries:
                if m._generation == gen:
                    self._settles.append((op, m.bookmark, m.deliveries))
                else:
                    stale += 1
        if stale:
            self.refused += stale
            self.lost += stale
        if len(self._settles) * 2 >= max(self.backlog, 1):
            self._flush()
        return None

    def _settle_wait(self, op: str, messages: list[Message], timeout: float = 30.0,
                     delay_ms: int = -1, error: str = "") -> dict[int, str]:
        """Settle now (after the settles made before) and wait for each verdict. A
        message of an earlier session is ``lost`` without asking: its lease ended with it.
        ``delay_ms``: a cancel's own delay (-1: the queue's backoff)."""
        gen = self.generation
        results = {m.bookmark: "lost" for m in messages if m._generation != gen}
        live = [m for m in messages if m._generation == gen]
        if self.unstarted is not None:
            self.unstarted.settled((m.bookmark, m.deliveries) for m in live)
        if not live:
            return count_verdicts(self, results)
        self._flush()
        req = next(self._reqs)
        bookmarks = [m.bookmark for m in live]
        self._send(settle_command(op, self.sub_id, bookmarks, [m.deliveries for m in live], req, delay_ms, error))
        deadline = time.monotonic() + timeout
        while req not in self._replies:
            if self.generation != gen:  # the session was lost while waiting: so were these leases
                return count_verdicts(self, {**results, **{b: "lost" for b in bookmarks}})
            if time.monotonic() >= deadline:
                raise ConnectionLost(f"no verdict on a settle from {self.endpoint} within {timeout}s")
            self._pump(deadline)
        results.update(results_by_bookmark(self._replies.pop(req), bookmarks))  # type: ignore[arg-type]
        return count_verdicts(self, results)

    def _generation(self) -> int:
        return self.generation

    def _ask(self, make: Any, timeout: float) -> Any:
        """Send a request (after the settles made before it) and wait for its REPLY; an
        ERROR raises, a lost session raises ``SessionLost``."""
        gen = self.generation
        self._flush()
        req = next(self._reqs)
        self._asking.add(req)
        try:
            self._send(make(req))
            deadline = time.monotonic() + timeout
            while req not in self._replies:
                if self.generation != gen:
                    raise SessionLost("the session ended before the answer")
                if time.monotonic() >= deadline:
                    raise ConnectionLost(f"no answer from {self.endpoint} within {timeout}s")
                self._pump(deadline)
        finally:
            self._asking.discard(req)
        answer = self._replies.pop(req)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def _start(self, msg: Message) -> bool:
        if msg._generation != self.generation:
            return False  # its session is gone, and its lease with it
        return self.unstarted is None or self.unstarted.start(msg.bookmark, msg.deliveries)

    def _extend(self, msg: Message, ms: int) -> None:
        if msg._generation == self.generation and self._sock is not None:
            self._send(wire.Extend(self.sub_id, [msg.bookmark], ms, [msg.deliveries]))

    # ------------------------------------------------------------ session

    def _open_session(self) -> None:
        if self._sock is not None:
            old, self._sock = self._sock, None
            close_session_socket(old)
        sock, self._poller = open_session(self._endpoints.current, self.ctx, self.name, self._curve)
        self._sock = sock
        self.generation += 1
        self._local.clear()  # delivered in a session that is gone: redelivered
        if self.unstarted is not None:
            self.unstarted.reset()
        self._settles.clear()
        self._replies.clear()
        gone = SessionLost("the session ended before the answer")
        for answered in self._later.values():  # transactions sent, not answered: their leases ended with the session
            answered(gone)
        self._later.clear()
        for _, answered in self._txs:  # ... and those not sent yet
            answered(gone)
        self._txs.clear()
        self.backlog = 0
        self._subscribe_req = next(self._reqs)
        sock.send(wire.encode(wire.Subscribe(self._subscribe_req, self.sub_id, self.queue, self.max_backlog, self.filter,
                                             bool(self.reclaimable))))
        self._last_heard = self._last_sent = time.monotonic()

    def _send(self, cmd: object) -> None:
        assert self._sock is not None
        try:
            self._sock.send(wire.encode(cmd))
        except zmq.Again:  # not taken for SEND_TIMEOUT_MS: the dispatcher is gone
            self._lost("it took no frame for a while")
            return
        self._last_sent = time.monotonic()

    def _flush(self) -> None:
        if (self._settles or self._txs) and self._sock is not None:
            try:
                if self._settles:
                    self._send_settles(self._sock)
                if self._txs:
                    self._send_txs(self._sock)
            except zmq.Again:
                self._lost("it took no frame for a while")
                return
            self._last_sent = time.monotonic()

    def _commit_later(self, tx: tuple, answered: Any) -> None:
        """A transaction not waited for: it waits, as settles do, for the next flush (the
        worker about to wait, or half its backlog to settle), and leaves in one TXS frame
        with the others (each still all or nothing on its own)."""
        self._txs.append((tx, answered))
        if (len(self._txs) + len(self._settles)) * 2 >= max(self.backlog, 1):
            self._flush()

    def _send_txs(self, sock: zmq.Socket) -> None:
        """The waiting transactions, in as few TXS frames as the dispatcher's limits allow."""
        txs, self._txs = self._txs, []
        sent = 0
        try:
            for frame in tx_frames(txs):
                self._send_tx_frame(sock, frame)
                sent += len(frame)
        except BaseException:
            self._txs = txs[sent:] + self._txs  # (the next session answers each of them lost: none forgotten)
            raise

    def _send_tx_frame(self, sock: zmq.Socket, txs: list[tuple[tuple, Any]]) -> None:
        callbacks = [answered for _, answered in txs]

        def answered(answer: Any) -> None:
            if isinstance(answer, BaseException):
                for each in callbacks:
                    each(answer)
                return
            for each, result in zip(callbacks, answer.get("results", ())):
                each(error_from(result["error"], result.get("message", "")) if "error" in result else result)

        req = next(self._reqs)
        self._later[req] = answered
        sock.send(wire.encode(wire.TransactMany(req, self.sub_id, [tx for tx, _ in txs])))

    def _lost(self, why: str) -> None:
        """The session is over (``session_lost``, or a send that timed out): a new one,
        to the next endpoint (or the leader a not-leader named), said once per reason.
        Before the first session, a refused handshake ends the connect (and so do
        refusals from every endpoint, unless waiting for a dispatcher)."""
        kind = why.kind if isinstance(why, Lost) else "silent"
        if not self._served:
            self._refused = self._refused + 1 if kind == "refused" else 0
            if kind == "security" or (kind == "refused" and not self._wait and self._endpoints.zookeeper is None
                                      and self._refused >= len(self._endpoints.all)):
                raise connect_error(self.endpoint, why)  # type: ignore[arg-type]
        self._last_why = why
        self._retry_log.note(self._endpoints.current, why, self._served)
        self._endpoints.failed()
        self._open_session()

    def _send_settles(self, sock: zmq.Socket) -> None:
        settles, self._settles = self._settles, []
        send_settles(sock, self.sub_id, settles)

    def _pump(self, deadline: float | None) -> None:
        """Wait for frames until ``deadline`` (at most half a heartbeat) and handle them;
        send a heartbeat when one is due; reconnect when the dispatcher went silent."""
        sock = self._sock
        if sock is None:
            raise StopIteration
        hb = self.heartbeat_ms / 1000
        now = time.monotonic()
        if now - self._last_sent >= hb / 2:
            self._send(wire.Heartbeat())
            if self._sock is not sock:  # lost meanwhile: a new session is open
                return
        wait = hb / 2 if deadline is None else min(hb / 2, max(0.0, deadline - now))
        # Rounded up: the last fraction of a millisecond before a deadline was poll(0),
        # again and again, a spin of up to 1 ms at the end of every wait that timed out.
        # Idle workers in a get(timeout) loop held a core that way 0.5% of the time
        # each, and on two cores that was much of the latency tail (#34).
        if self._poller.poll(math.ceil(wait * 1000)):
            decode = wire.server_decoder.decode
            while readable(sock):
                try:
                    frame = sock.recv(NOBLOCK)
                except zmq.Again:
                    break
                self._last_heard = time.monotonic()
                try:
                    msg = decode(frame)
                except msgspec.MsgspecError as exc:
                    log.error("undecodable frame from the dispatcher: %s", exc)
                    continue
                if self._on_frame(msg) == "reset":
                    self._endpoints.failed()
                    self._open_session()
                    return
                if self._sock is not sock:  # lost while answering it (a send that timed out)
                    return
        why = session_lost(sock, self._last_heard, hb * self.liveness, time.monotonic(),
                           refused_ends=not self._wait and not self._served)
        if why is not None:
            self._lost(why)

    def _on_frame(self, msg: object) -> str | None:
        t = type(msg)
        if t is wire.DeliverRecords:
            if msg.sub == self.sub_id:  # type: ignore[attr-defined]
                gen = self.generation
                self._local.extend(Message(r, n, self, gen) for r, n in zip(msg.records, msg.deliveries))  # type: ignore[arg-type, attr-defined]
                if self.unstarted is not None:
                    self.unstarted.delivered((r.seq, n) for r, n in zip(msg.records, msg.deliveries))  # type: ignore[attr-defined]
        elif t is wire.Revoke:
            if msg.sub == self.sub_id and self._sock is not None:  # type: ignore[attr-defined]
                back = ([], [], list(msg.bookmarks), list(msg.epochs))  # type: ignore[attr-defined]
                if self.unstarted is not None:
                    back = self.unstarted.revoke(msg.bookmarks, msg.epochs)  # type: ignore[attr-defined]
                self._send(wire.Release(self.sub_id, *back))
        elif t is wire.Subscribed:
            self.backlog = msg.backlog  # type: ignore[attr-defined]
            self.group_header = msg.group_header  # type: ignore[attr-defined]
        elif t is wire.Welcome:
            if session_answer(msg, self._endpoints) == "reset":  # a deposed leader
                return "reset"
            self.heartbeat_ms = msg.heartbeat_ms  # type: ignore[attr-defined]
            self._served = True
            self._retry_log.served()
        elif t is wire.Refused:
            self.refused += len(msg.bookmarks)  # type: ignore[attr-defined]
            if msg.reason == "lost":  # type: ignore[attr-defined]
                self.lost += len(msg.bookmarks)  # type: ignore[attr-defined]
        elif t is wire.Reply:
            later = self._later.pop(msg.req, None)  # type: ignore[attr-defined]
            if later is not None:
                later(msg.data)  # type: ignore[attr-defined]
            else:
                self._replies[msg.req] = msg.data  # type: ignore[attr-defined]
        elif t is wire.Error:
            if session_answer(msg, self._endpoints) == "reset":  # a standby's not-leader, or the session ended
                return "reset"
            code, text, req = msg.code, msg.message, msg.req  # type: ignore[attr-defined]
            if req and req in self._asking:
                self._replies[req] = error_from(code, text)
                return None
            if req and req in self._later:
                self._later.pop(req)(error_from(code, text))
                return None
            if req and req == self._subscribe_req:
                raise error_from(code, text)
            log.error("dispatcher error: %s: %s", code, text)
        return None
