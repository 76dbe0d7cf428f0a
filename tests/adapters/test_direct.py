"""The direct path of an embedded dispatcher: ``zq.Publisher(d)`` and ``zq.Worker(d, q)``
step the dispatcher in their own threads (zq.server.local), beside remote clients on
real sockets and the dispatcher's own loop thread, against a real LMDB journal."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

import zq
from zq import wire
from zq.core.errors import ConnectionLost, LimitError
from zq.journal.lmdb_journal import LmdbJournal
from zq.core.settings import QueueSettings
from zq.server.config import Config

from .support import env, wait_until


@pytest.fixture
def dispatcher(tmp_path):
    d = zq.Dispatcher(Config(data=str(tmp_path / "d"), bind=["tcp://127.0.0.1:0"], max_message_bytes=1 << 20)).start()
    yield d
    d.stop()


def queue_stats(d: zq.Dispatcher, queue: str) -> dict:
    with zq.connect(d.endpoint) as c:
        return c.stats()["queues"].get(queue, {})


def test_a_direct_publisher_and_worker_move_every_message_once_in_order(dispatcher):
    with zq.Publisher(dispatcher) as p:
        sent = p.publish_many("jobs", [f"m{i}" for i in range(300)])
        sent.append(p.publish("jobs", b"last", msg_id="last-1"))
    got = []
    with zq.Worker(dispatcher, "jobs", max_backlog=16) as w:
        assert w.backlog == 16
        while len(got) < len(sent):
            batch = w.get_many(16, timeout=5)
            assert batch, f"stalled after {len(got)}"
            got += [m.bookmark for m in batch]
            assert all(m.deliveries == 1 and m.topic == "jobs" for m in batch)
            w.ack_many(batch)
        assert w.get(timeout=0.05) is None
    assert got == sent
    wait_until(lambda: queue_stats(dispatcher, "jobs").get("acked") == len(sent), what="every ack")


def test_direct_and_remote_clients_serve_each_other(dispatcher):
    """Deliveries a direct step makes for a remote worker leave through the loop thread's
    socket (the outbox), and a remote publish reaches a direct worker's inbox."""
    with zq.Worker(dispatcher.endpoint, "to-remote", max_backlog=8) as remote, zq.Publisher(dispatcher) as p:
        sent = p.publish_many("to-remote", [b"a", b"b", b"c"])
        got = []
        while len(got) < 3:
            m = remote.get(timeout=5)
            assert m is not None, f"the remote worker got {got}"
            got.append(m.bookmark)
            m.ack()
        assert got == sent
    with zq.Worker(dispatcher, "to-local") as local, zq.Publisher(dispatcher.endpoint) as rp:
        b = rp.publish("to-local", b"over tcp")
        m = local.get(timeout=5)
        assert m is not None and (m.bookmark, m.data) == (b, b"over tcp")
        m.ack()


def test_a_direct_publish_is_in_the_journal_when_it_returns(tmp_path):
    """Each publish returned its bookmark after the commit that stored it: every one is
    in the journal of a process SIGKILLed right after."""
    data = tmp_path / "journal"
    script = (
        "import sys, zq\n"
        f"d = zq.Dispatcher(zq.Config(data={str(data)!r}, bind=[])).start()\n"
        "p = zq.Publisher(d)\n"
        "for i in range(100000):\n"
        "    print(p.publish('jobs', b'x%d' % i), flush=True)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], env=env(), stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    confirmed = [int(proc.stdout.readline()) for _ in range(300)]
    proc.kill()
    proc.wait(10)
    confirmed += [int(line) for line in proc.stdout.read().split()]
    j = LmdbJournal(str(data), readonly=True)
    try:
        stored = {m.seq for m in j.read_messages(0)}
    finally:
        j.close()
    assert set(confirmed) <= stored, f"confirmed but not stored: {sorted(set(confirmed) - stored)[:10]}"


def test_a_closed_direct_worker_returns_its_messages_and_a_lease_expiry_redelivers(tmp_path):
    config = Config(data=str(tmp_path / "d"), bind=[],
                    queues=[QueueSettings(name="short", lease_ms=300, max_deliveries=5)])
    with zq.Dispatcher(config) as d, zq.Publisher(d) as p:
        p.publish_many("jobs", [b"a", b"b"])
        w1 = zq.Worker(d, "jobs", max_backlog=4)
        taken = w1.get_many(4, timeout=5)
        assert len(taken) == 2
        w1.close()  # never acked: back to the queue, in order
        with zq.Worker(d, "jobs") as w2:
            again = [w2.get(timeout=5), w2.get(timeout=5)]
            assert [m.bookmark for m in again] == [m.bookmark for m in taken]
            assert [m.deliveries for m in again] == [2, 2]
            w2.ack_many(again)
        # A lease taken by a direct step is expired by the loop thread's timer.
        b = p.publish("short", b"slow")
        with zq.Worker(d, "short") as w3:
            first = w3.get(timeout=5)
            assert first is not None and first.bookmark == b  # held, never settled
            second = w3.get(timeout=10)
            assert second is not None and second.bookmark == b and second.deliveries == 2
            second.ack()


def test_bad_frames_on_a_direct_session_get_errors_and_the_dispatcher_goes_on(dispatcher):
    link = dispatcher.open_link("raw")

    def decode(frame: bytes) -> object:  # the next answer (the loop's heartbeats may come between)
        msg = wire.server_decoder.decode(frame)
        while type(msg) is wire.Heartbeat:
            msg = wire.server_decoder.decode(link.recv())
        return msg

    assert type(decode(link.recv())) is wire.Welcome
    for frame in (b"\xff\x00garbage", b"", wire.encode(wire.Publish(1, "", [(b"x", {}, None)])),
                  wire.encode(wire.Publish(2, "jobs", [(b"x" * (2 << 20), {}, None)])),
                  wire.encode(wire.Ack("no-such-sub", [1, 2**64 - 1]))):
        link.send(frame)
        reply = decode(link.recv())
        assert type(reply) in (wire.Error, wire.Refused), reply
    link.send(wire.encode(wire.Publish(3, "jobs", [(b"fine", {}, None)])))
    reply = decode(link.recv())
    assert type(reply) is wire.Confirm and reply.req == 3
    link.close()
    with zq.Publisher(dispatcher) as p:
        with pytest.raises(LimitError):
            p.publish("jobs", b"x" * (2 << 20))  # refused before it is sent
        with pytest.raises((TypeError, ValueError)):
            p.publish("jobs", 17)  # type: ignore[arg-type]
        assert p.publish("jobs", b"still serving") > 0


def test_stopping_the_dispatcher_ends_direct_sessions_at_once(tmp_path):
    d = zq.Dispatcher(Config(data=str(tmp_path / "d"), bind=[])).start()
    p = zq.Publisher(d)
    w = zq.Worker(d, "jobs")
    outcome: list[object] = []

    def wait_in_get() -> None:
        try:
            outcome.append(w.get(timeout=30))
        except ConnectionLost as exc:
            outcome.append(exc)

    t = threading.Thread(target=wait_in_get)
    t.start()
    time.sleep(0.05)  # let it block in get (it returns either way; this only makes the case the blocked one)
    started = time.monotonic()
    d.stop()
    t.join(10)
    assert not t.is_alive() and isinstance(outcome[0], ConnectionLost), outcome
    assert time.monotonic() - started < 5  # woken by the stop, not by its 30 s timeout
    with pytest.raises(ConnectionLost, match="stopped"):
        p.publish("jobs", b"late")
    p.close()  # closing after the stop is quiet
    w.close()
    with pytest.raises(ConnectionLost):
        zq.Publisher(d)
    with pytest.raises(zq.ZqError, match="start"):
        zq.Publisher(zq.Dispatcher(Config(data=str(tmp_path / "never"), bind=[])))


def test_many_direct_threads_and_remote_workers_lose_and_repeat_nothing(dispatcher):
    """Four publishing threads and two direct workers step the dispatcher while the loop
    thread serves a remote worker: every message is acked exactly once."""
    per_thread, threads = 400, 4
    taken: list[int] = []
    lock = threading.Lock()
    done = threading.Event()

    def consume(target: object) -> None:
        with zq.Worker(target, "mixed", max_backlog=8) as w:
            while not done.is_set():
                batch = w.get_many(8, timeout=0.1)
                with lock:
                    taken.extend(m.bookmark for m in batch)
                w.ack_many(batch)

    def publish(k: int) -> None:
        with zq.Publisher(dispatcher) as p:
            for i in range(per_thread):
                p.publish("mixed", f"{k}-{i}")

    with zq.Publisher(dispatcher) as p:
        p.publish("mixed", b"first")  # the queue exists before the workers subscribe
    workers = [threading.Thread(target=consume, args=(t,)) for t in (dispatcher, dispatcher, dispatcher.endpoint)]
    publishers = [threading.Thread(target=publish, args=(k,)) for k in range(threads)]
    for t in workers + publishers:
        t.start()
    for t in publishers:
        t.join(60)
    total = per_thread * threads + 1
    wait_until(lambda: queue_stats(dispatcher, "mixed").get("acked") == total, timeout=60, what="every ack")
    done.set()
    for t in workers:
        t.join(10)
    assert len(taken) == total and len(set(taken)) == total


def test_direct_sessions_need_no_key_on_a_secured_dispatcher(tmp_path):
    """The embedding process is trusted: its direct sessions have every right, while a
    plaintext client over tcp still gets nothing."""
    from zq.keys import keygen

    keys, allowed = tmp_path / "keys", tmp_path / "allowed"
    keys.mkdir()
    allowed.mkdir()
    keygen(str(keys), "server")
    (tmp_path / "zq.toml").write_text(f'[server]\ndata = "{tmp_path / "d"}"\nbind = ["tcp://127.0.0.1:0"]\n'
                                      '[security]\nsecret_key = "keys/server.key_secret"\nallow = "allowed"\n')
    with zq.Dispatcher.from_config(str(tmp_path / "zq.toml")) as d:
        with zq.Publisher(d) as p, zq.Worker(d, "jobs") as w:
            b = p.publish("jobs", b"inside")
            m = w.get(timeout=5)
            assert m is not None and m.bookmark == b
            m.ack()
        with pytest.raises(ConnectionLost):
            zq.Publisher(d.endpoint, connect_timeout=1.0)
