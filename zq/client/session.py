"""What ``Client``, ``Publisher`` and ``Worker`` share: opening a session (a DEALER with
HELLO sent), checking every argument in the caller's thread (a value that cannot travel
is a clear error at the call, never a dead I/O thread later), encoding commands, and
turning the dispatcher's error codes back into exceptions."""

from __future__ import annotations

import itertools
import logging
import math
import os
import re
import struct
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import NamedTuple

import msgspec
import zmq

from zq import wire
from zq.core import limits
from zq.core.errors import ConnectionLost, ZqError  # noqa: F401 -- ConnectionLost: clients import it from here
from zq.keys import apply_client_curve

log = logging.getLogger("zq.client")

# Plain ints: ``getsockopt(zmq.EVENTS) & zmq.POLLIN`` builds an enum member per call.
EVENTS, POLLIN, NOBLOCK = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.NOBLOCK)


def readable(sock: object) -> bool:
    """Is a frame waiting on this socket (pyzmq's, or an embedded dispatcher's in-process
    link)? Asking costs less than a ``recv`` that raises ``zmq.Again`` (1.5 against 3.5 µs
    here): the clients ask before every read, the session's monitor included (issue #34:
    reading an empty monitor each round cost a worker 16 µs a round). Raises
    ``zmq.ZMQError`` once a pyzmq socket is closed."""
    return bool(sock.getsockopt(EVENTS) & POLLIN)  # type: ignore[attr-defined]


ERRORS: dict[str, type[ZqError]] = {}


def _error_types() -> dict[str, type[ZqError]]:
    if not ERRORS:
        from zq.core import errors

        for name in dir(errors):
            obj = getattr(errors, name)
            if isinstance(obj, type) and issubclass(obj, ZqError):
                ERRORS[obj.code] = obj
    return ERRORS


class SessionLost(ConnectionLost):
    """A request's session was lost before its answer came (it may or may not have been
    applied; it is not sent again). A settle waiting for its verdict is ``lost``."""


def error_from(code: str, message: str) -> ZqError:
    return _error_types().get(code, ZqError)(message)



def publish_chunks(items: list) -> Iterator[list]:
    """Publish batches of at most PUBLISH_BATCH_MAX messages and about PUBLISH_BATCH_BYTES."""
    chunk: list = []
    size = 0
    for item in items:
        if chunk and (len(chunk) >= limits.PUBLISH_BATCH_MAX or size + len(item[0]) > limits.PUBLISH_BATCH_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append(item)
        size += len(item[0])
    if chunk:
        yield chunk


SEND_TIMEOUT_MS = 5000  # a dispatcher that takes no frame for this long is gone: a send never blocks for good
CLOSING_SEND_TIMEOUT_MS = 200  # while closing: the last settles and BYE, each given this long, then given up
CLOSE_LINGER_MS = 1000  # a clean close: what was sent last (settles, BYE) may take this long to leave
_monitors = itertools.count(1)


class NotListening(ConnectionLost):
    """Nothing listens at the endpoint: its connection was refused outright, again and
    again (no ``zq serve`` there, or another address), before any session began."""


class HandshakeRefused(ConnectionLost):
    """The connection's security handshake failed (CurveZMQ keys, or none, that do not
    match the dispatcher's): trying again cannot help until a key or the config changes."""


# What the monitor reports: a drop ends a session; the rest says why one never began.
MONITORED = int(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED
                | zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
REFUSED_GRACE = 3  # connects refused in a row (libzmq retries every ~0.1-0.2 s) that mean nothing listens
UNCLEAR_GRACE = 2  # CurveZMQ handshakes the dispatcher cut short, in a row, that mean its key is another

# Why a connection served nothing, in the words every client uses (``session_lost``).
NOT_LISTENING = "connection refused: nothing is listening there"
KEY_REFUSED = "the dispatcher refused this client's key (not in its allowlist)"
SERVER_KEY_MISMATCH = "the dispatcher's key is not the one given (server_key mismatch)"
PLAINTEXT_REFUSED = ("the dispatcher requires CurveZMQ security; this client connected in plaintext "
                     "(give it its key and the dispatcher's: key and server_key, or ZQ_KEY and ZQ_SERVER_KEY)")
CURVE_REFUSED = ("the dispatcher does not use CurveZMQ security; this client was given keys "
                 "(key and server_key, or ZQ_KEY and ZQ_SERVER_KEY)")


class Lost(str):
    """Why a session is over (``session_lost``), and of what ``kind``: ``"dropped"``,
    ``"silent"``, ``"refused"`` (nothing listens: ``NotListening``) or ``"security"``
    (a handshake refused: ``HandshakeRefused``)."""

    kind = "silent"

    @classmethod
    def of(cls, kind: str, text: str) -> "Lost":
        why = cls(text)
        why.kind = kind
        return why


class Watch:
    """What a session's monitor has told so far (``watch``)."""

    __slots__ = ("curve", "connected", "failed", "dropped", "refused", "unclear", "refusal")

    def __init__(self, curve: bool) -> None:
        self.curve = curve  # this client uses CurveZMQ
        self.connected = False  # a connection was ever made (refusals count only before one)
        self.failed = False  # the current connection's handshake failed (its drop is no session's)
        self.dropped = False  # a connection that had served dropped: the session is over
        self.refused = 0  # connects refused in a row, before any connection
        self.unclear = 0  # CurveZMQ handshakes cut short by the dispatcher, in a row
        self.refusal: str | None = None  # a security handshake that failed: why, in words

    def event(self, event: int, value: int) -> None:
        if event == zmq.EVENT_CONNECTED:
            self.connected, self.failed = True, False
        elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self.unclear, self.refusal = 0, None
        elif event == zmq.EVENT_DISCONNECTED:
            if not self.failed:  # (a handshake that failed said why already)
                self.dropped = True
        elif event == zmq.EVENT_CONNECT_RETRIED:
            if not self.connected:
                self.refused += 1
        elif event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:  # the dispatcher's ZAP handler said no
            self.failed = True
            self.refusal = KEY_REFUSED if value == 400 else f"the dispatcher refused this client (ZAP status {value})"
        elif event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            if value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:  # one side CurveZMQ, the other plaintext
                self.failed = True
                self.refusal = CURVE_REFUSED if self.curve else PLAINTEXT_REFUSED
            elif self.curve and value in (zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC, zmq.PROTOCOL_ERROR_ZMTP_KEY_EXCHANGE):
                self.failed = True
                self.refusal = SERVER_KEY_MISMATCH
            # (any other: its drop ends the session, as a drop)
        elif event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
            # A CurveZMQ dispatcher that cannot read our HELLO (sealed for another server
            # key) closes the connection without a word: seen as a broken pipe or reset
            # here, again at each of libzmq's retries. Once could be a dispatcher stopping.
            # A plaintext client of a CurveZMQ dispatcher sees this first too (a broken
            # pipe), and the mechanism mismatch only at libzmq's next try on this socket:
            # the drop is not a session's, so the socket stays for that try.
            self.failed = True
            self.unclear += 1
            if self.curve and self.unclear >= UNCLEAR_GRACE:
                self.refusal = SERVER_KEY_MISMATCH


_MONITOR_EVENT = struct.Struct("=Hi")


class SessionSocket(zmq.Socket):
    """A session's DEALER, and the PAIR its monitor reports to (``watch``)."""

    zq_monitor: zmq.Socket | None = None
    zq_watch: Watch | None = None


def open_session_socket(ctx: zmq.Context, endpoint: str, name: str,
                        curve: tuple[bytes, bytes, bytes] | None = None) -> SessionSocket:
    """A DEALER to the dispatcher with HELLO sent: the start of every session, with a
    monitor that tells ``session_dropped`` when its connection drops.
    ``curve``: CurveZMQ keys (``zq.keys.client_curve``), or None for plaintext.

    Nothing is left open if this fails part-way (``close_session_socket``). The monitor
    has its own inproc address (not pyzmq's, made of the socket's file descriptor, which
    a new socket can reuse while the old monitor's address is still bound) and no
    receive limit: libzmq's I/O thread sends it events with a blocking send, so a
    monitor that filled up would stop every socket of the context (and its close would
    wait on the blocked thread for good)."""
    sock = ctx.socket(zmq.DEALER, socket_class=SessionSocket)
    try:
        apply_client_curve(sock, curve)
        sock.zq_watch = Watch(curve is not None)
        sock.setsockopt(zmq.LINGER, 0)  # closing says how long (close_session_socket)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.SNDTIMEO, SEND_TIMEOUT_MS)
        address = f"inproc://zq-session-monitor-{os.getpid()}-{next(_monitors)}"
        sock.monitor(address, MONITORED)
        mon = ctx.socket(zmq.PAIR, socket_class=zmq.Socket)  # (a plain one from a zmq.asyncio context too)
        sock.zq_monitor = mon  # (before anything else can fail: closed with the socket)
        mon.setsockopt(zmq.LINGER, 0)
        mon.setsockopt(zmq.RCVHWM, 0)
        mon.connect(address)
        sock.connect(endpoint)
        try:
            sock.send(wire.encode(wire.Hello(wire.PROTOCOL_VERSION, name, list(ACCEPTS))))
        except zmq.Again:
            # No connection to queue it on (a handshake the server refused, e.g. plaintext
            # to a CurveZMQ dispatcher, drops it): no WELCOME comes, and the caller's wait
            # for one ends this attempt as it would any unanswered session.
            pass
    except BaseException:
        close_session_socket(sock)
        raise
    return sock


def watch(sock: object) -> Watch | None:
    """Read what the session's monitor reported since last asked; None for an
    in-process link. A closed monitor (the context terminated) counts as a drop."""
    mon = getattr(sock, "zq_monitor", None)
    state = getattr(sock, "zq_watch", None)
    if mon is None or state is None:
        return None
    while True:
        try:
            if not readable(mon):  # (nearly always: asking costs less than a raised zmq.Again)
                return state
            frames = mon.recv_multipart(NOBLOCK)
        except zmq.Again:
            return state
        except zmq.ZMQError:  # closed under us (the context terminated): nothing more to hear
            state.dropped = True
            return state
        if len(frames) == 2 and len(frames[0]) == 6:  # a u16 event, an i32 value; then the address
            state.event(*_MONITOR_EVENT.unpack(frames[0]))


def session_dropped(sock: object) -> bool:
    """Did the connection under this session drop? A dispatcher whose process died
    closed it (its kernel did), and so does a cluster leader that steps down (it closes
    its socket): waiting out the heartbeats would only delay moving on. A new connection
    would be a new session anyway (the dispatcher knows its peers by connection, and a
    HELLO it had read is gone with the old one), so a drop ends the session either way.
    A security handshake that failed ends it too (``session_lost`` says which)."""
    state = watch(sock)
    return state is not None and (state.dropped or state.refusal is not None)


def closing(sock: object) -> None:
    """The session is being closed: its last sends (settles, BYE) may not block long."""
    if isinstance(sock, zmq.Socket):
        try:
            sock.setsockopt(zmq.SNDTIMEO, CLOSING_SEND_TIMEOUT_MS)
        except zmq.ZMQError:
            pass


def close_session_socket(sock: object, linger: int = 0) -> None:
    """Close a session's socket and its monitor, in that order of care: the monitor is
    switched off before its PAIR closes (libzmq would otherwise block on an event for a
    PAIR that is gone). A socket's close never raises and never waits: ``linger`` (ms)
    only lets the last frames leave, in libzmq's own thread."""
    if isinstance(sock, SessionSocket):
        mon, sock.zq_monitor = sock.zq_monitor, None
        try:
            sock.monitor(None, 0)
        except zmq.ZMQError:
            pass  # closed already (its monitor went with it), or the context terminated
        if mon is not None:
            mon.close(0)
    try:
        sock.close(linger)  # type: ignore[attr-defined]
    except zmq.ZMQError:
        pass


def session_lost(sock: object, last_heard: float, window_s: float, now: float,
                 refused_ends: bool = False) -> Lost | None:
    """Is this session over, and why? The one rule of every client (``zq.Client``'s I/O
    thread, ``zq.Worker``, ``zq.Publisher``): its security handshake failed (the
    dispatcher refused our key, or the keys do not match: ``kind == "security"``), its
    connection dropped (``session_dropped``), or nothing came from the dispatcher for
    ``window_s`` (heartbeat × liveness), welcomed or not: a HELLO that a cluster leader
    stepping down had read is never answered, and libzmq's own reconnection carries no
    HELLO. Then the client opens a new session (the next endpoint, or the leader a
    not-leader named). ``refused_ends``: a connection refused ``REFUSED_GRACE`` times in
    a row ends it at once (``kind == "refused"``), not after the silence; else libzmq
    goes on trying (a dispatcher restarting), and the silence names the refusals."""
    state = watch(sock)
    if state is not None:
        if state.refusal is not None:
            return Lost.of("security", state.refusal)
        if state.dropped:
            return Lost.of("dropped", "its connection dropped")
        if refused_ends and state.refused >= REFUSED_GRACE:
            return Lost.of("refused", NOT_LISTENING)
    if now - last_heard > window_s:
        if state is not None and state.refused and not state.connected:
            return Lost.of("refused", NOT_LISTENING)
        return Lost.of("silent", f"silent for {now - last_heard:.1f}s")
    return None


def waiting_on(state: Watch | None) -> str | None:
    """Why a session that is not over yet has not begun, if its monitor says: for the
    error of a connect that timed out before ``session_lost`` had a verdict."""
    if state is None:
        return None
    if state.refusal is not None:
        return state.refusal
    if state.refused and not state.connected:
        return NOT_LISTENING
    return None


def connect_error(endpoint: object, why: Lost) -> ConnectionLost:
    """The error of a first connection that failed for ``why``."""
    if why.kind == "security":
        return HandshakeRefused(f"{endpoint}: {why}")
    if why.kind == "refused":
        return NotListening(f"nothing is listening at {endpoint} (connection refused)")
    return ConnectionLost(f"{endpoint}: {why}")


class RetryLog:
    """Says why a client is not served once per reason, not once per attempt: a
    dispatcher that is restarting (or not started yet) would otherwise fill the log
    with the same line every few seconds. ``served`` forgets what was said."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self.said: set[str] = set()

    def note(self, endpoint: object, why: str, ever_served: bool) -> None:
        key = f"{endpoint} {why}"
        if key in self.said:
            self.logger.debug("still no zq dispatcher at %s (%s): trying again", endpoint, why)
            return
        self.said.add(key)
        if ever_served:
            self.logger.warning("zq dispatcher at %s lost (%s): reconnecting", endpoint, why)
        else:
            self.logger.warning("no zq dispatcher at %s yet (%s): still trying", endpoint, why)

    def served(self) -> None:
        self.said.clear()


ACCEPTS = (wire.NOTICE,)  # the optional frames every client here understands (its HELLO says so)


class NoticeLog:
    """Says the dispatcher's NOTICE (what held publish confirmations wait for) once per
    reason while the publishes wait: as a WARNING of ``logger``, or to ``hook`` when one
    is set (the CLI prints it). ``confirmed`` (nothing is waiting any more) forgets
    what was said, so that a later wait is told again."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self.said: set[tuple[str, str]] = set()
        self.hook: Callable[[wire.Notice], object] | None = None

    def tell(self, msg: wire.Notice) -> None:
        key = (msg.code, msg.queue)
        if key in self.said:
            return
        self.said.add(key)
        if self.hook is not None:
            try:
                self.hook(msg)
            except Exception:  # noqa: BLE001 -- a caller's hook never ends the client's I/O
                self.logger.exception("on_notice hook failed")
            return
        self.logger.warning("publish not confirmed yet (%d frame%s waiting %.1fs): %s", msg.held,
                            "" if msg.held == 1 else "s", msg.waited_ms / 1000, msg.message)

    def confirmed(self) -> None:
        if self.said:
            self.said.clear()


def session_answer(msg: object, endpoints: "Endpoints") -> str | None:
    """What a frame says about the session, the same in every client: ``"welcome"``
    (served, by a leader no older than one seen), ``"reset"`` (over: a deposed leader's
    WELCOME, a standby's ``not-leader``, which sends the next session to the leader it
    names, or the dispatcher ended it), None for anything else."""
    t = type(msg)
    if t is wire.Welcome:
        return "reset" if endpoints.stale(msg.epoch) else "welcome"  # type: ignore[attr-defined]
    if t is wire.Error:
        code = msg.code  # type: ignore[attr-defined]
        if code == wire.NOT_LEADER:
            log.info("%s is not the leader (%s): moving on", endpoints.current, msg.message)  # type: ignore[attr-defined]
            endpoints.redirect(msg.message)  # type: ignore[attr-defined]
            return "reset"
        if code == wire.NO_SESSION:  # (its words are for any peer: these are a client's)
            log.warning("the dispatcher at %s has no session for this client (it timed out, or the dispatcher "
                        "restarted): reconnecting", endpoints.current)
            return "reset"
        if code in wire.SESSION_ENDING:
            log.warning("the dispatcher at %s ended our session (%s): reconnecting", endpoints.current,
                        msg.message)  # type: ignore[attr-defined]
            return "reset"
    return None


def open_session(target: object, ctx: zmq.Context, name: str,
                 curve: tuple[bytes, bytes, bytes] | None = None) -> tuple:
    """``(socket, poller)`` of a new session with HELLO sent. ``target`` is an endpoint,
    or an embedded dispatcher (``zq.Dispatcher``): then the session is an in-process
    link, socket-shaped and its own poller, whose sends step the dispatcher in the
    calling thread (zq.server.local; found by its ``open_link``, so this room imports
    nothing of the server's)."""
    open_link = getattr(target, "open_link", None)
    if open_link is not None:
        link = open_link(name)
        return link, link
    sock = open_session_socket(ctx, target, name, curve)  # type: ignore[arg-type]
    poller = zmq.Poller()  # one per session, kept: Socket.poll builds a Poller per call
    poller.register(sock, zmq.POLLIN)
    poller.register(sock.zq_monitor, zmq.POLLIN)  # a dropped connection ends a wait at once
    return sock, poller


def check_target(target: object) -> None:
    """An endpoint string, or an embedded dispatcher."""
    if not hasattr(target, "open_link"):
        check_endpoint(target)


SETTLE_COMMANDS = {"ack": wire.Ack, "cancel": wire.Cancel, "expire": wire.Expire}


def settle_command(op: str, sub_id: str, bookmarks: list[int], epochs: list[int], req: int,
                   delay_ms: int = -1, error: str = "") -> object:
    """An answered settle; a cancel may carry its own delay and the error it failed with."""
    if op == "cancel" and (delay_ms >= 0 or error):
        return wire.Cancel(sub_id, bookmarks, epochs, req, delay_ms, error)
    return SETTLE_COMMANDS[op](sub_id, bookmarks, epochs, req)


def cancel_options(delay: object, error: object) -> tuple[int, str] | None:
    """A cancel's own ``delay`` (seconds) and ``error`` as the frame's ``delay_ms`` and
    ``error``; None for a plain cancel (batched like acks)."""
    if delay is None and error is None:
        return None
    return (duration_arg(delay, "delay", allow_zero=True) if delay is not None else -1,
            error_arg(error) if error is not None else "")


def error_arg(error: object) -> str:
    """A failed cancel's error: a string (an exception is taken as ``repr``), cut to
    ``ERROR_TEXT_MAX`` characters, so a long traceback never turns a nack into a refusal."""
    if isinstance(error, BaseException):
        error = repr(error)
    if not isinstance(error, str):
        raise TypeError(f"error: a string or an exception, got {type(error).__name__}")
    return error[: limits.ERROR_TEXT_MAX]


def send_settles(sock: zmq.Socket, sub_id: str, settles: list[tuple[str, int, int]]) -> bool:
    """``(op, bookmark, epoch)`` settles of one subscription as one frame per op, fenced
    by each delivery's epoch (its delivery count); False if none."""
    if not settles:
        return False
    ops, bookmarks_all, epochs_all = zip(*settles)
    if ops.count(ops[0]) == len(ops):  # the usual case, one op: one frame without a Python step per settle
        sock.send(wire.encode(SETTLE_COMMANDS[ops[0]](sub_id, list(bookmarks_all), list(epochs_all))))
        return True
    by_op: dict[str, tuple[list[int], list[int]]] = {}
    for op, bookmark, epoch in settles:
        bookmarks, epochs = by_op.setdefault(op, ([], []))
        bookmarks.append(bookmark)
        epochs.append(epoch)
    for op, (bookmarks, epochs) in by_op.items():
        sock.send(wire.encode(SETTLE_COMMANDS[op](sub_id, bookmarks, epochs)))
    return bool(by_op)


def results_by_bookmark(answer: dict, bookmarks: list[int]) -> dict[int, str]:
    """A settle's REPLY (result -> bookmarks) as bookmark -> result."""
    out: dict[int, str] = {}
    for result, seqs in answer.items():
        for seq in seqs:
            out[seq] = "unknown" if result == "unknown-subscription" else result
    return {b: out.get(b, "unknown") for b in bookmarks}


TX_RESULTS = ("lost", "dead", "done", "unknown", "unknown-subscription")


def outputs_arg(publish: object) -> list[tuple[str, list[tuple[bytes, dict[str, str], str | None]]]]:
    """A transaction's outputs as TX carries them, checked in the caller's thread:
    ``publish`` holds ``(topic, data)``, ``(topic, data, headers)`` or ``(topic, data,
    headers, msg_id)`` tuples; neighbours of one topic share an entry, in order (an
    output's derived id follows its place in the transaction)."""
    if isinstance(publish, (str, bytes, dict)) or not hasattr(publish, "__iter__"):
        raise TypeError(f"publish: a list of (topic, data[, headers[, msg_id]]) tuples, got {type(publish).__name__}")
    out: list[tuple[str, list[tuple[bytes, dict[str, str], str | None]]]] = []
    for item in publish:  # type: ignore[attr-defined]
        if not isinstance(item, tuple) or not 2 <= len(item) <= 4:
            raise TypeError(f"publish: each output is (topic, data[, headers[, msg_id]]), got {item!r:.60}")
        topic = item[0]
        if type(topic) is not str or not topic:
            raise TypeError(f"publish: an output's topic must be a non-empty str, got {topic!r:.60}")
        one = wire_item(item[1], None, None, item[3] if len(item) > 3 else None, item[2] if len(item) > 2 else None)
        if out and out[-1][0] == topic:
            out[-1][1].append(one)
        else:
            out.append((topic, [one]))
    return out


TX_TOPICS_MAX = 64  # distinct output topics in one TX or TXS frame (the dispatcher's limit)
TX_BYTES_MAX = 32 * 1024 * 1024  # a TXS frame's payload bytes, about (libzmq closes a connection past 64 MiB)
TXS_MAX = 1024  # transactions in one TXS frame (the dispatcher's limit)


def tx_size(outputs: list[tuple[str, list[tuple[bytes, dict[str, str], str | None]]]]) -> tuple[int, int]:
    """(messages, bytes about) of a transaction's outputs."""
    count = size = 0
    for topic, items in outputs:
        size += len(topic)
        for payload, headers, msg_id in items:
            count += 1
            size += len(payload) + 16 + (len(msg_id) if msg_id else 0)
            for k, v in headers.items():
                size += len(k) + len(v) + 4
    return count, size


def check_tx(bookmarks: list[int], outputs: list[tuple[str, list[tuple[bytes, dict[str, str], str | None]]]]) -> int:
    """A transaction the dispatcher could never take, refused here (and not retried by a
    worker forever, nor cutting its session as an oversized frame would); returns its
    size in bytes, about."""
    from zq.core import limits
    from zq.core.errors import LimitError, ProtocolError
    from zq.core.transactions import DERIVED_PREFIX

    count, size = tx_size(outputs)
    if count > limits.PUBLISH_BATCH_MAX:
        raise LimitError(f"a transaction publishes at most {limits.PUBLISH_BATCH_MAX} messages, not {count}")
    if len({topic for topic, _ in outputs}) > TX_TOPICS_MAX:
        raise LimitError(f"a transaction publishes to at most {TX_TOPICS_MAX} topics")
    if len(bookmarks) > limits.ACK_BATCH_MAX:
        raise LimitError(f"a transaction settles at most {limits.ACK_BATCH_MAX} messages")
    if size > TX_BYTES_MAX:
        raise LimitError(f"a transaction of {size:,} bytes is over what one frame carries ({TX_BYTES_MAX:,})")
    for _, items in outputs:
        for _, _, msg_id in items:
            if msg_id is not None and msg_id.startswith(DERIVED_PREFIX):
                raise ProtocolError(f"message ids starting {DERIVED_PREFIX!r} are the dispatcher's (derived for "
                                    "transactions' outputs)")
    return size


def tx_outcome(answer: dict, bookmarks: list[int]) -> tuple[bool, dict[int, str], list[int]]:
    """A TX's REPLY as (committed, bookmark -> verdict, the outputs' bookmarks in order).
    Not committed: each input not live has its settle's verdict; the others ``held``
    (nothing happened to them: still this consumer's to settle)."""
    if answer.get("committed"):
        return True, dict.fromkeys(bookmarks, "ok"), [seq for seqs in answer.get("published", ()) for seq in seqs]
    verdicts = dict.fromkeys(answer.get("held", ()), "held")
    for result in TX_RESULTS:
        for seq in answer.get(result, ()):
            verdicts[seq] = "unknown" if result == "unknown-subscription" else result
    return False, {b: verdicts.get(b, "unknown") for b in bookmarks}, []


def drain_frames(sock: zmq.Socket, limit: int = 1000) -> Iterator[bytes]:
    for _ in range(limit):
        if not readable(sock):
            return  # nothing waiting: ask, rather than pay for a raised zmq.Again
        try:
            yield sock.recv(NOBLOCK)
        except zmq.Again:
            return


def wire_item(
    data: bytes | str, group: str | None, priority: int | None, msg_id: str | None, headers: dict[str, str] | None
) -> tuple[bytes, dict[str, str], str | None]:
    """One message as the wire carries it, checked in the caller's thread: a value that
    cannot travel is a clear error here, not a silent failure later."""
    if isinstance(data, str):
        payload = data.encode()
    elif isinstance(data, (bytes, bytearray, memoryview)):
        payload = bytes(data)
    else:
        raise TypeError(f"message data must be bytes or str, got {type(data).__name__}")
    h: dict[str, str] = {}
    if headers:
        if not isinstance(headers, dict):
            raise TypeError(f"headers must be a dict of str to str, got {type(headers).__name__}")
        for k, v in headers.items():
            if type(k) is not str or type(v) is not str:
                raise TypeError(f"header {k!r}: names and values must be str, got {type(v).__name__} "
                                f"{v!r:.40} (write str(value))")
            h[k] = v
    if group is not None:
        h["group"] = str(group)
    if priority is not None:
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise TypeError(f"priority must be an int, got {type(priority).__name__}")
        h["priority"] = str(priority)
    if msg_id is not None and type(msg_id) is not str:
        raise TypeError(f"msg_id must be a str, got {type(msg_id).__name__}")
    return (payload, h, msg_id)


class Outgoing(NamedTuple):
    """A call queued for the I/O thread: encoded in the caller's thread, sent in order."""

    req: int
    cmd: object
    frame: bytes
    fut: Future | None
    order: int


def encode_command(cmd: object) -> bytes:
    """Encode a client command, or raise ValueError naming what cannot travel.

    msgspec encodes whatever a field holds; decoding our own frame checks each field
    against the protocol's types (wire.client_decoder), as the dispatcher will."""
    try:
        frame = wire.encode(cmd)
    except (OverflowError, TypeError, msgspec.EncodeError) as exc:
        raise ValueError(f"cannot send {type(cmd).__name__}: {exc}") from None
    if type(cmd) is not wire.Publish:  # publishes are checked message by message (wire_item)
        try:
            wire.client_decoder.decode(frame)
        except msgspec.MsgspecError as exc:
            raise ValueError(f"cannot send {type(cmd).__name__}: {exc}") from None
    return frame


def bookmark_arg(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 64:
        raise ValueError(f"a bookmark is an int 0..2**64-1, got {value!r:.40}")
    return value


def duration_arg(seconds: object, what: str, *, allow_zero: bool = False) -> int:
    """Seconds from the caller as whole milliseconds in 1 (or 0) .. 100 years."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise TypeError(f"{what}: seconds must be a number, got {type(seconds).__name__}")
    if not math.isfinite(seconds) or not (0 if allow_zero else 0.001) <= seconds <= limits.DURATION_MS_MAX / 1000:
        raise ValueError(f"{what}: {seconds!r} seconds is out of range "
                         f"({'0' if allow_zero else '0.001'}..{limits.DURATION_MS_MAX // 1000})")
    return int(seconds * 1000)


def delay_fields(delay: object, not_before: object) -> tuple[int, int]:
    """A publish's ``delay`` (seconds) and ``not_before`` (Unix seconds) as the frame's
    ``delay_ms`` and ``not_before_ms``. The delay is counted on the dispatcher's clock."""
    delay_ms = duration_arg(delay, "delay", allow_zero=True) if delay is not None else 0
    not_before_ms = 0
    if not_before is not None:
        if isinstance(not_before, bool) or not isinstance(not_before, (int, float)) or not math.isfinite(not_before):
            raise TypeError(f"not_before: Unix seconds as a number, got {not_before!r:.40}")
        if not 0 <= not_before <= 4_102_444_800 * 25:  # 0 .. about the year 5000
            raise ValueError(f"not_before: {not_before!r} is not a Unix time in seconds")
        not_before_ms = int(not_before * 1000)
    return delay_ms, not_before_ms


def publish_fields(delay: object, not_before: object, ttl: object = None, expires_at: object = None) -> tuple[int, int, int, int]:
    """A publish's timing as the PUBLISH frame's ``delay_ms``, ``not_before_ms``,
    ``ttl_ms`` and ``expires_at_ms``: ``delay`` and ``ttl`` in seconds (counted on the
    dispatcher's clock from when it takes the frame), ``not_before`` and ``expires_at``
    in Unix seconds. A message still waiting at its ttl or expires_at (the sooner)
    expires with reason ``ttl``."""
    delay_ms, not_before_ms = delay_fields(delay, not_before)
    ttl_ms = duration_arg(ttl, "ttl") if ttl is not None else 0
    expires_at_ms = 0
    if expires_at is not None:
        if isinstance(expires_at, bool) or not isinstance(expires_at, (int, float)) or not math.isfinite(expires_at):
            raise TypeError(f"expires_at: Unix seconds as a number, got {expires_at!r:.40}")
        if not 0 < expires_at <= 4_102_444_800 * 25:  # after 1970 .. about the year 5000
            raise ValueError(f"expires_at: {expires_at!r} is not a Unix time in seconds")
        expires_at_ms = max(int(expires_at * 1000), 1)
    return delay_ms, not_before_ms, ttl_ms, expires_at_ms


_SCHEMES = ("tcp://", "ipc://", "inproc://", "pgm://", "epgm://", "ws://", "wss://", "vmci://")


class Endpoints:
    """Where a client's sessions go: one endpoint, or several (``"tcp://a:7780,tcp://b:7780"``:
    a leader and its standbys). One at a time (a DEALER connected to several would
    round-robin between them); a session that fails moves to the next, and a standby's
    ``not-leader`` answer names the leader, tried next. An embedded dispatcher is one.

    Or a cluster's ZooKeeper (``"zk://10.0.0.9:2181/zq/orders"``): its nodes' endpoints
    are read from there, the leader first, and read again each time the list has been
    tried through, or as many endpoints as it holds have failed (redirects included)."""

    def __init__(self, target: object) -> None:
        self.zookeeper = target if isinstance(target, str) and target.startswith(ZK_SCHEME) else None
        if self.zookeeper is not None:
            self.all: list[object] = cluster_endpoints(self.zookeeper)
        else:
            self.all = [p.strip() for p in target.split(",")] if isinstance(target, str) else [target]
        self.i = 0
        self.hint: str | None = None
        self.hint_fresh = False
        self.failures = 0  # endpoints that did not serve since the last that did (hints included)
        self.epoch = 0  # the newest cluster leader epoch a session of ours was welcomed by

    def stale(self, epoch: int) -> bool:
        """A WELCOME from a leader older than one already seen (a deposed leader that
        still answers): True, and the session is dropped; else note the epoch."""
        if epoch < self.epoch:
            log.warning("%s leads epoch %d, older than epoch %d seen: a deposed leader; moving on",
                        self.current, epoch, self.epoch)
            return True
        self.epoch = epoch
        self.hint_fresh = False  # the leader it named served: when it fails, move on from it
        self.failures = 0
        return False

    @property
    def current(self) -> object:
        return self.hint if self.hint is not None else self.all[self.i]

    def redirect(self, message: str) -> None:
        """A ``not-leader`` answer: the next session goes to the leader it names."""
        hint = wire.leader_hint(message)
        if hint is not None:
            self.hint, self.hint_fresh = hint, True

    def failed(self) -> None:
        """The current endpoint did not serve (silence, a lost session, a refusal): move on."""
        if self.hint_fresh:
            self.hint_fresh = False  # (a redirect just now: go where it said)
            return
        gone = self.current
        self.failures += 1
        wrapped = False
        if self.hint is None:
            self.i = (self.i + 1) % len(self.all)
            wrapped = self.i == 0
        # Tried through, hints included (two standbys naming a leader that is gone would
        # otherwise send us between them without ever reaching the list's end), or back
        # at its start: ask ZooKeeper again, where the leader is listed first.
        if self.zookeeper is not None and (wrapped or self.failures >= len(self.all)):
            self.failures = 0
            try:
                self.all, self.i = cluster_endpoints(self.zookeeper), 0
            except ConnectionLost as exc:
                log.warning("%s", exc)
        self.hint = None  # back to the list where it was, but never straight back to what failed
        if self.all[self.i] == gone:  # (the leader a hint named is in the list too)
            self.i = (self.i + 1) % len(self.all)


ZK_SCHEME = "zk://"
_ZK_TARGET = re.compile(r"zk://([A-Za-z0-9.:\[\]-]{1,200}(?:,[A-Za-z0-9.:\[\]-]{1,200}){0,8})((?:/[A-Za-z0-9_.-]{1,64}){1,8})")


def cluster_endpoints(target: str) -> list[object]:
    """A cluster's endpoints, from its ZooKeeper: the leader's first, then every live
    node's (``zq.server.election`` keeps them there)."""
    m = _ZK_TARGET.fullmatch(target)
    if m is None:
        raise ValueError(f"a cluster address is zk://HOST:PORT[,HOST:PORT...]/PATH, got {target[:100]!r}")
    hosts, path = m.groups()
    try:
        from kazoo.client import KazooClient
        from kazoo.exceptions import KazooException, NoNodeError
        from kazoo.handlers.threading import KazooTimeoutError
    except ImportError:  # kazoo comes with the cluster extra
        raise ConnectionLost("zk:// addresses need kazoo: pip install 'zq[cluster]'") from None
    zk = KazooClient(hosts=hosts, timeout=5.0)
    try:
        zk.start(timeout=5)
    except (KazooTimeoutError, KazooException, OSError) as exc:
        zk.stop()  # (its connection thread would go on trying)
        zk.close()
        raise ConnectionLost(f"no ZooKeeper answered at {hosts} ({exc!r})") from None
    try:
        found: list[object] = []
        try:
            raw, _ = zk.get(f"{path}/state")
            leader = msgspec.json.decode(raw).get("endpoint") if raw else None
            if isinstance(leader, str) and leader.startswith("tcp://"):
                found.append(leader)
            for name in sorted(zk.get_children(f"{path}/nodes")):
                raw, _ = zk.get(f"{path}/nodes/{name}")
                ep = msgspec.json.decode(raw).get("endpoint")
                if isinstance(ep, str) and ep.startswith("tcp://") and ep not in found:
                    found.append(ep)
        except (NoNodeError, msgspec.DecodeError, AttributeError):
            pass
        except (KazooException, OSError) as exc:  # ZooKeeper lost mid-read: a client's I/O must not die of it
            raise ConnectionLost(f"ZooKeeper at {hosts} failed while reading {path}: {exc!r}") from None
        if not found:
            raise ConnectionLost(f"no zq cluster at {target} (nothing under {path} in ZooKeeper)")
        return found
    finally:
        zk.stop()
        zk.close()


def check_endpoint(endpoint: object) -> None:
    """Refuse an endpoint libzmq would choke on, in the caller's thread."""
    if not isinstance(endpoint, str) or not endpoint:
        raise ValueError(f"an endpoint is a string such as tcp://127.0.0.1:7780, got {endpoint!r}")
    if endpoint.startswith(ZK_SCHEME):
        if _ZK_TARGET.fullmatch(endpoint) is None:
            raise ValueError(f"a cluster address is zk://HOST:PORT[,HOST:PORT...]/PATH, got {endpoint[:100]!r}")
        return
    for part in endpoint.split(","):
        part = part.strip()
        if not part.startswith(_SCHEMES):
            raise ValueError(f"endpoint {part!r} has no transport: write tcp://{part} "
                             f"(or ipc://, inproc://)")
        if part.startswith("tcp://"):
            m = _TCP_ENDPOINT.fullmatch(part)
            if m is None or not 1 <= int(m.group(1)) <= 65535:
                raise ValueError(f"endpoint {part[:100]!r}: a tcp endpoint is tcp://HOST:PORT (a port 1..65535, "
                                 "nothing after it), e.g. tcp://127.0.0.1:7780")
        elif part.split("://", 1)[1] == "":
            raise ValueError(f"endpoint {part!r} names no address after its transport")


# tcp://HOST:PORT, HOST a name, an IPv4 address or [IPv6]; libzmq's "SOURCE;" prefix allowed.
_TCP_ENDPOINT = re.compile(r"tcp://(?:[^;/\s]+;)?(?:\[[0-9A-Fa-f:.%a-z]+\]|[A-Za-z0-9._-]+):(\d{1,5})")


