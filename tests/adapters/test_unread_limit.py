"""A peer that does not read cannot make the dispatcher hold its answers (issue 32 §3).

libzmq bounds what waits for one peer in frames (1,000), not bytes; the dispatcher
bounds it in bytes (``server.max_unread``, zq.server.outflow), measuring what the peer's
host acknowledged. Real TCP sockets on loopback; the non-readers are bare DEALERs with a
one-frame receive queue and a tiny kernel buffer, as a hostile peer would set them.
"""

from __future__ import annotations

import time

import pytest
import zmq

import zq
from zq import wire
from zq.server.config import Config

from .support import answer, raw_session, wait_until

LIMIT = 1 << 20  # server.max_unread at its smallest
BODY = b"u" * (256 << 10)


@pytest.fixture
def dispatcher(tmp_path):
    config = Config(data=str(tmp_path / "d"), bind=["tcp://127.0.0.1:0"], max_unread_bytes=LIMIT,
                    heartbeat_ms=200, heartbeat_liveness=3)
    d = zq.Dispatcher(config).start()
    yield d
    d.stop()


def non_reader(endpoint: str, name: str) -> zmq.Socket:
    """HELLO said, WELCOME read; from here on it reads only when the test says so (a
    one-frame receive queue, a 4 KiB kernel buffer)."""
    return raw_session(endpoint, name, RCVHWM=1, RCVBUF=4096)


def stats(d) -> dict:  # type: ignore[no-untyped-def]
    with zq.connect(d.inproc) as c:
        return c.stats()


def peer_named(st: dict, name: str) -> dict | None:
    return next((p for p in st["peers"] if p["name"] == name), None)


def take_all(d, queue: str, n: int, backlog: int) -> list[int]:  # type: ignore[no-untyped-def]
    """The bookmarks of ``n`` messages a reading worker takes from ``queue`` and acks."""
    got: list[int] = []
    with zq.Worker(d.endpoint, queue, max_backlog=backlog) as w:
        while len(got) < n:
            msg = w.get(timeout=10)
            assert msg is not None, f"stalled after {len(got)} of {n}"
            got.append(msg.bookmark)
            msg.ack()
    return got


def test_a_peer_that_asks_and_never_reads_is_refused_past_the_limit_and_served_once_it_reads(dispatcher):
    with zq.connect(dispatcher.inproc) as c:
        c.publish_many("big", [BODY] * 16)  # 4 MiB: each RANGE answer is about that
    sock = non_reader(dispatcher.endpoint, "deaf")
    try:
        asked = 40
        for req in range(1, asked + 1):  # 160 MiB of answers, were they all sent
            sock.send(wire.encode(wire.Range(req, "messages", 0, None, "big")))
        # At most four are answered at once per connection (counted once sent) ...
        wait_until(lambda: (peer_named(stats(dispatcher), "deaf") or {}).get("sent_bytes", 0) > LIMIT, timeout=20,
                   what="the first answers to be sent")
        # ... and once what it was sent passes the limit unread, it is refused until it reads.
        for req in range(asked + 1, 2 * asked + 1):
            sock.send(wire.encode(wire.Range(req, "messages", 0, None, "big")))
        wait_until(lambda: stats(dispatcher)["server"]["unread"]["refused_unread"] >= 1, timeout=20,
                   what="a RANGE refused for the bytes still unread")
        st = stats(dispatcher)
        sent = peer_named(st, "deaf")["sent_bytes"]
        assert sent <= LIMIT + 4 * (4 << 20) + (1 << 20), f"{sent >> 20} MiB sent to a peer that reads nothing"
        assert st["server"]["unread"]["max_unread_bytes"] == LIMIT
        # It reads now: every request has an answer, the refused ones an error that says why.
        answered, refused = 0, []
        deadline = time.monotonic() + 20
        while answered + len(refused) < 2 * asked and time.monotonic() < deadline:
            if not sock.poll(1000):
                continue
            msg = wire.server_decoder.decode(sock.recv())
            if type(msg) is wire.Records:
                answered += 1
            elif type(msg) is wire.Error:
                refused.append(msg)
        assert answered + len(refused) == 2 * asked, (answered, len(refused))
        assert 1 <= answered <= 4
        assert all(e.code == "limit" for e in refused), refused[:2]
        assert any("unread" in e.message and "max_unread" in e.message for e in refused)
        assert any("RANGE requests of this connection are still being answered" in e.message for e in refused)
        # Having read, it is served again.
        sock.send(wire.encode(wire.Range(2 * asked + 1, "messages", 0, None, "big")))
        while True:
            assert sock.poll(10_000), "no answer after reading everything"
            msg = wire.server_decoder.decode(sock.recv())
            if type(msg) is not wire.Heartbeat:
                break
        assert type(msg) is wire.Records and msg.req == 2 * asked + 1
    finally:
        sock.close(0)


def test_a_worker_that_stops_reading_is_cut_off_and_its_messages_go_to_one_that_reads(dispatcher):
    sock = non_reader(dispatcher.endpoint, "stuck")
    try:
        sock.send(wire.encode(wire.Subscribe(1, "s", "jobs", 100)))
        assert type(answer(sock)) is wire.Subscribed
        with zq.connect(dispatcher.inproc) as c:
            sent = c.publish_many("jobs", [BODY] * 40)  # 10 MiB, all leased to "stuck" (backlog 100)
        # Deliveries past the limit wait as bookmarks; it keeps talking (heartbeats, so it is
        # not silent) but reads nothing for its dead-peer window (600 ms): cut off, its
        # leases go back.

        def cut_off() -> bool:
            sock.send(wire.HEARTBEAT_FRAME)
            return stats(dispatcher)["server"]["unread"]["cut_off_unread"] == 1

        wait_until(cut_off, timeout=20, interval=0.1, what="the worker that reads nothing to be cut off")
        st = stats(dispatcher)
        assert st["server"]["unread"]["paused_deliveries"] >= 1
        assert peer_named(st, "stuck") is None
        assert sorted(take_all(dispatcher, "jobs", len(sent), 8)) == sorted(sent)
    finally:
        sock.close(0)


def test_a_worker_that_reads_takes_a_burst_far_over_the_limit_and_is_never_cut_off(dispatcher):
    with zq.connect(dispatcher.inproc) as c:
        sent = c.publish_many("burst", [BODY] * 160)  # 40 MiB, forty times the limit
    got = []
    with zq.Worker(dispatcher.endpoint, "burst", max_backlog=160) as w:
        while len(got) < len(sent):
            msg = w.get(timeout=10)
            assert msg is not None, f"stalled after {len(got)} of {len(sent)}"
            assert msg.deliveries == 1
            got.append(msg.bookmark)
            msg.ack()
    assert got == sent
    unread = stats(dispatcher)["server"]["unread"]
    assert unread["cut_off_unread"] == 0 and unread["refused_unread"] == 0


def ask_ranges(sock: zmq.Socket, first: int, n: int, target: str = "big") -> None:
    for req in range(first, first + n):
        sock.send(wire.encode(wire.Range(req, "messages", 0, None, target)))


@pytest.mark.parametrize("restart", ["hello", "bye-hello"])
def test_a_new_session_on_the_same_connection_starts_from_what_the_last_left_unread(dispatcher, restart):
    """A second HELLO (or BYE, then HELLO) must not give a connection the limit afresh
    while libzmq still holds what its last session never read."""
    with zq.connect(dispatcher.inproc) as c:
        c.publish_many("big", [BODY] * 16)
    sock = non_reader(dispatcher.endpoint, "again")
    try:
        ask_ranges(sock, 1, 4)
        wait_until(lambda: (peer_named(stats(dispatcher), "again") or {}).get("sent_bytes", 0) > LIMIT, timeout=20,
                   what="the first answers to be sent")
        if restart == "bye-hello":
            sock.send(wire.encode(wire.Bye()))
        sock.send(wire.encode(wire.Hello(wire.PROTOCOL_VERSION, "again")))  # (its WELCOME is not read either)
        ask_ranges(sock, 5, 4)
        wait_until(lambda: stats(dispatcher)["server"]["unread"]["refused_unread"] >= 1, timeout=20,
                   what="the new session's RANGE refused for the old one's unread bytes")
        assert peer_named(stats(dispatcher), "again")["sent_bytes"] > LIMIT
    finally:
        sock.close(0)


@pytest.mark.parametrize("keeps", ["asking", "saying-hello"])
def test_a_peer_that_only_asks_and_never_reads_is_cut_off_after_its_dead_peer_window(dispatcher, keeps):
    """Saying HELLO again (a new session on the same connection) does not start the window
    anew: a HELLO every 0.3 s once kept a non-reader from ever being cut off."""
    with zq.connect(dispatcher.inproc) as c:
        c.publish_many("big", [BODY] * 16)
    sock = non_reader(dispatcher.endpoint, "asker")
    try:
        ask_ranges(sock, 1, 4)

        def cut_off() -> bool:
            if keeps == "saying-hello":
                sock.send(wire.encode(wire.Hello(wire.PROTOCOL_VERSION, "asker")))
            sock.send(wire.encode(wire.Peek(99, "big", 100)))  # keeps asking (and so keeps talking)
            return stats(dispatcher)["server"]["unread"]["cut_off_unread"] == 1

        wait_until(cut_off, timeout=20, interval=0.1, what="the peer that never reads to be cut off")
        assert peer_named(stats(dispatcher), "asker") is None
    finally:
        sock.close(0)


def test_a_decode_error_does_not_echo_a_huge_frame_back(dispatcher):
    """msgspec's error names an unknown tag in full: a peer with no session, sending 1 MiB
    tags and never reading, once had each echoed back whole."""
    import msgspec

    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(dispatcher.endpoint)
    try:
        sock.send(msgspec.msgpack.encode(["X" * (1 << 20), 1]))
        assert sock.poll(10_000)
        err = wire.server_decoder.decode(sock.recv())
        assert type(err) is wire.Error and err.code == "protocol"
        assert len(err.message) <= 2100, len(err.message)
    finally:
        sock.close(0)


def test_threads_sharing_one_client_each_get_their_range(dispatcher):
    """The dispatcher answers 4 RANGEs of a connection at once; a client's threads wait
    their turn rather than get ``limit``."""
    import threading

    with zq.connect(dispatcher.inproc) as c:
        c.publish_many("big", [BODY] * 16)
    errors: list[BaseException] = []
    got: list[int] = []
    start = threading.Barrier(16)
    with zq.connect(dispatcher.endpoint) as c:
        def read() -> None:
            try:
                start.wait(10)
                got.append(len(c.read_range(target="big", timeout=20).blob))
            except BaseException as exc:  # noqa: BLE001 -- reported below
                errors.append(exc)

        threads = [threading.Thread(target=read) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert not errors, errors[:2]
    assert len(got) == 16 and all(n > 4 << 20 for n in got)


@pytest.mark.parametrize("key", ["max_unread", "max_unread_total"])
@pytest.mark.parametrize(("value", "words"), [
    ("'512KiB'", "must be 1MiB..64GiB"),
    ("'65GiB'", "must be 1MiB..64GiB"),
    ("'-1MiB'", ""),
    ("64", ""),
    ("true", ""),
    ("'x' ", ""),
    ("'" + "9" * 200 + "MiB'", ""),
])
def test_a_bad_unread_limit_is_refused_naming_the_key(tmp_path, key, value, words):
    from zq.core.errors import ConfigError

    path = tmp_path / "zq.toml"
    path.write_text(f"[server]\n{key} = {value}\n")
    with pytest.raises(ConfigError, match=f"server.{key}[: ].*{words}"):
        Config.load(path)
    path.write_text(f"[server]\n{key} = '256MiB'\n")
    loaded = Config.load(path)
    assert getattr(loaded, f"{key}_bytes") == 256 << 20
    assert (Config().max_unread_bytes, Config().max_unread_total_bytes) == (64 << 20, 1 << 30)


def test_a_peer_that_reads_a_trickle_while_over_its_limit_is_cut_off(dispatcher):
    """Any progress restarted the dead-peer window (and dipping under the limit let one
    more frame go), so 40 peers reading 16 KiB/s while deliveries waited for them were
    never cut off and kept the dispatcher brimful. Now a peer over its limit must read a
    quarter of it within its window (600 ms here), or be cut off."""
    with zq.connect(dispatcher.inproc) as c:
        c.create_queue("drip", max_per_subscription_backlog=1000)
    sock = non_reader(dispatcher.endpoint, "trickle")
    try:
        for sub in ("s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8"):  # (1,000 each: 2.7 MB, past the 1 MiB limit)
            sock.send(wire.encode(wire.Subscribe(1, sub, "drip", 1000)))
            assert type(answer(sock)) is wire.Subscribed
        with zq.connect(dispatcher.inproc) as c:
            sent = c.publish_many("drip", [b"d" * 300] * 8000)  # DELIVER frames of 256: ~80 KB each

        turns = iter(range(1_000_000))

        def cut_off() -> bool:
            if next(turns) % 2 == 0 and sock.poll(0):
                sock.recv()  # one ~80 KB frame every 0.2 s: it reads all the time, under a quarter of the limit a window
            sock.send(wire.HEARTBEAT_FRAME)  # (it keeps talking: silence is not what cuts it off)
            return stats(dispatcher)["server"]["unread"]["cut_off_unread"] == 1

        wait_until(cut_off, timeout=20, interval=0.1, what="the peer reading a trickle to be cut off")
        unread = stats(dispatcher)["server"]["unread"]
        assert unread["paused_deliveries"] >= 1 and peer_named(stats(dispatcher), "trickle") is None
        assert sorted(take_all(dispatcher, "drip", len(sent), 500)) == sorted(sent)  # its messages go on
    finally:
        sock.close(0)


def test_a_settle_that_would_echo_its_bookmarks_is_refused_while_its_peer_is_over_its_limit(tmp_path):
    """A settle's answer lists its bookmarks (a REPLY with ``req``, or a REFUSED per
    reason): ACKs of 65,536 made-up bookmarks each drew a 590 KB answer, never held back.
    (A dead-peer window of 20 s here: the peer must not be cut off while it is tried.)"""
    config = Config(data=str(tmp_path / "d"), bind=["tcp://127.0.0.1:0"], max_unread_bytes=LIMIT,
                    heartbeat_ms=1000, heartbeat_liveness=20)
    dispatcher = zq.Dispatcher(config).start()
    try:
        settle_echo_refused(dispatcher)
    finally:
        dispatcher.stop()


def settle_echo_refused(dispatcher) -> None:  # type: ignore[no-untyped-def]
    with zq.connect(dispatcher.inproc) as c:
        c.publish_many("small", [b"s" * 4096] * 16)  # PEEK answers of ~64 KiB: its libzmq takes in two at most
    sock = non_reader(dispatcher.endpoint, "echo")
    try:
        asked = iter(range(1, 10_000))
        refused = stats(dispatcher)["server"]["unread"]["refused_unread"]

        def over_its_limit() -> bool:
            sock.send(wire.encode(wire.Peek(next(asked), "small", 16)))
            return stats(dispatcher)["server"]["unread"]["refused_unread"] > refused

        wait_until(over_its_limit, timeout=20, interval=0.05, what="a PEEK refused for the bytes unread")
        before = peer_named(stats(dispatcher), "echo")["sent_bytes"]
        refused = stats(dispatcher)["server"]["unread"]["refused_unread"]
        bookmarks = list(range(1, 65_537))
        for req in range(5):
            sock.send(wire.encode(wire.Ack("nosuch", bookmarks, [], 100 + req)))
            sock.send(wire.encode(wire.Ack("nosuch", bookmarks, [])))
        wait_until(lambda: stats(dispatcher)["server"]["unread"]["refused_unread"] >= refused + 10, timeout=20,
                   what="the ten settles to be refused")
        grown = peer_named(stats(dispatcher), "echo")["sent_bytes"] - before
        assert grown < 64 << 10, f"{grown} bytes of answers to a peer over its limit"
    finally:
        sock.close(0)
