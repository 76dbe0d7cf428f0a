"""What a client learns from its session's monitor, asked without a raised zmq.Again
(``zq.client.session.readable``, ``watch``): a connection that drops is seen, a frame
waiting is seen, and a monitor closed under the client counts as a drop, never an error."""

import time

import zmq

from zq import wire
from zq.client.session import (
    close_session_socket,
    open_session_socket,
    readable,
    send_settles,
    session_dropped,
    watch,
)


def test_readable_says_whether_a_frame_waits_and_raises_once_the_socket_is_closed():
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    try:
        a.bind("inproc://readable")
        b.connect("inproc://readable")
        assert readable(a) is False
        b.send(b"x")
        deadline = time.monotonic() + 5
        while not readable(a) and time.monotonic() < deadline:
            time.sleep(0.001)
        assert readable(a) is True and a.recv() == b"x"
        assert readable(a) is False
        a.close(0)
        try:
            readable(a)
        except zmq.ZMQError:
            pass
        else:
            raise AssertionError("a closed socket said something (or nothing) instead of raising")
    finally:
        b.close(0)
        ctx.term()


def test_readable_asks_an_in_process_link_through_its_own_getsockopt():
    class Link:  # (an embedded dispatcher's link: zq.server.local, not a pyzmq socket)
        def __init__(self, waiting: bool) -> None:
            self.waiting = waiting

        def getsockopt(self, option: int) -> int:
            assert option == zmq.EVENTS
            return zmq.POLLIN if self.waiting else 0

    assert readable(Link(True)) is True and readable(Link(False)) is False


def drop_seen(sock: object, within_s: float = 5.0) -> bool:
    """Does the session's monitor tell of the drop within ``within_s``?"""
    deadline = time.monotonic() + within_s
    while not session_dropped(sock) and time.monotonic() < deadline:
        time.sleep(0.005)
    return session_dropped(sock)


def test_watch_sees_the_connection_drop_when_the_dispatcher_side_closes():
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.bind("tcp://127.0.0.1:*")
    endpoint = router.getsockopt_string(zmq.LAST_ENDPOINT)
    sock = open_session_socket(ctx, endpoint, "watched")
    try:
        assert router.poll(5000), "no HELLO reached the ROUTER"
        router.recv_multipart()
        deadline = time.monotonic() + 5
        while not watch(sock).connected and time.monotonic() < deadline:  # type: ignore[union-attr]
            time.sleep(0.005)
        assert watch(sock).connected and not session_dropped(sock)  # type: ignore[union-attr]
        router.close(0)
        assert drop_seen(sock), "the connection's drop was not seen within 5 s"
    finally:
        close_session_socket(sock)
        ctx.term()


def test_a_monitor_closed_under_the_client_counts_as_a_drop_not_an_error():
    ctx = zmq.Context()
    sock = open_session_socket(ctx, "tcp://127.0.0.1:9", "orphaned")  # (nothing listens there)
    try:
        # As the context's end closes it: the socket's monitoring off first (libzmq would
        # otherwise block its I/O thread on an event for the closed PAIR), then the PAIR.
        sock.monitor(None, 0)
        sock.zq_monitor.close(0)  # type: ignore[union-attr]
        state = watch(sock)
        assert state is not None and state.dropped
        assert session_dropped(sock)
    finally:
        close_session_socket(sock)
        ctx.term()


class Sent:
    """A socket that keeps what is sent on it (``send_settles`` only sends)."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def send(self, frame: bytes) -> None:
        self.frames.append(frame)


def settle_frames(settles: list[tuple[str, int, int]]) -> tuple[bool, list[tuple[str, list[int], list[int]]]]:
    sock = Sent()
    sent = send_settles(sock, "w", settles)  # type: ignore[arg-type]
    out = []
    for frame in sock.frames:
        cmd = wire.client_decoder.decode(frame)
        assert cmd.sub == "w"  # type: ignore[attr-defined]
        out.append((type(cmd).__name__, list(cmd.bookmarks), list(cmd.epochs)))  # type: ignore[attr-defined]
    return sent, out


def test_settles_of_one_op_leave_as_one_frame_and_mixed_ops_as_one_frame_per_op_in_order():
    assert settle_frames([]) == (False, [])
    assert settle_frames([("ack", 5, 1), ("ack", 3, 2), ("ack", 9, 1)]) == (True, [("Ack", [5, 3, 9], [1, 2, 1])])
    sent, frames = settle_frames([("ack", 5, 1), ("cancel", 6, 3), ("ack", 7, 1), ("expire", 8, 2), ("cancel", 4, 1)])
    assert sent and frames == [("Ack", [5, 7], [1, 1]), ("Cancel", [6, 4], [3, 1]), ("Expire", [8], [2])]
    assert settle_frames([("cancel", 1, 1)]) == (True, [("Cancel", [1], [1])])


def test_a_session_opened_on_a_zmq_asyncio_context_is_still_read_without_futures():
    """A user may hand the clients a ``zmq.asyncio.Context`` (``context=``): the session's
    sockets are plain ones all the same (the monitor's read once gave a Future, and
    ``watch`` raised TypeError)."""
    import zmq.asyncio

    ctx = zmq.asyncio.Context()
    router = ctx.socket(zmq.ROUTER, socket_class=zmq.Socket)
    router.bind("tcp://127.0.0.1:*")
    sock = open_session_socket(ctx, router.getsockopt_string(zmq.LAST_ENDPOINT), "on asyncio")
    try:
        assert router.poll(5000), "no HELLO reached the ROUTER"
        router.recv_multipart()
        router.close(0)
        assert drop_seen(sock), "the connection's drop was not seen within 5 s"
    finally:
        close_session_socket(sock)
        ctx.term()
