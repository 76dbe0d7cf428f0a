"""zq.Worker: the single-threaded consumer, against real dispatchers over real sockets."""

from __future__ import annotations

import time

import pytest

import zq
from zq.server.config import Config

from .support import ServerProcess, wait_until


@pytest.fixture
def dispatcher(tmp_path):
    d = zq.Dispatcher(Config(data=str(tmp_path / "d"), bind=["tcp://127.0.0.1:0"])).start()
    yield d
    d.stop()


def stats(endpoint: str, queue: str) -> dict:
    with zq.connect(endpoint) as c:
        return c.stats()["queues"].get(queue, {})


def test_a_worker_takes_every_message_once_and_acks_it(dispatcher):
    with zq.connect(dispatcher.inproc) as c:
        sent = c.publish_many("jobs", [f"m{i}" for i in range(500)], group=None)
    got = []
    with zq.Worker(dispatcher.endpoint, "jobs", max_backlog=16) as w:
        assert w.backlog == 16
        while len(got) < 500:
            msg = w.get(timeout=5)
            assert msg is not None, f"stalled after {len(got)}"
            assert msg.deliveries == 1 and msg.topic == "jobs"
            got.append(msg.bookmark)
            msg.ack()
        assert w.get(timeout=0.05) is None  # nothing left: None after the timeout
    assert got == sent  # in order, each once
    wait_until(lambda: stats(dispatcher.endpoint, "jobs")["acked"] == 500, what="every ack to arrive")
    with zq.connect(dispatcher.endpoint) as c:
        server = c.stats()["server"]
    # 500 messages at a backlog of 16 take at least 32 DELIVER frames out and 32 settles in
    assert server["frames_out"] >= 32 and server["frames_in"] >= 32


def test_batches_and_lease_operations(dispatcher):
    with zq.connect(dispatcher.inproc) as c:
        sent = c.publish_many("ops", [f"m{i}" for i in range(40)])
    with zq.Worker(dispatcher.endpoint, "ops", max_backlog=8) as w:
        first = w.get_many(4, timeout=5)
        assert 1 <= len(first) <= 4
        w.cancel_many(first)  # back in their places, redelivered
        got: list[int] = []
        while len(got) < 40:
            batch = w.get_many(8, timeout=5)
            assert 1 <= len(batch) <= 8
            for m in batch:
                assert m.deliveries == (2 if m.bookmark in {f.bookmark for f in first} else 1)
                got.append(m.bookmark)
                if m.bookmark == first[0].bookmark:
                    m.extend(60)
                    m.expire()  # dead-lettered
                else:
                    m.ack()
    assert sorted(got) == sent
    wait_until(lambda: stats(dispatcher.endpoint, "ops").get("acked") == 39, what="acks")
    st = stats(dispatcher.endpoint, "ops")
    assert st["expired"] == 1 and st["cancelled"] == len(first)


def test_closing_returns_unsettled_messages_to_the_queue(dispatcher):
    with zq.connect(dispatcher.inproc) as c:
        sent = c.publish_many("ret", ["a", "b", "c"])
    with zq.Worker(dispatcher.endpoint, "ret", max_backlog=3) as w:
        taken = [w.get(5) for _ in range(3)]
        taken[0].ack()
    with zq.Worker(dispatcher.endpoint, "ret", max_backlog=3) as w2:
        again = [w2.get(5) for _ in range(2)]
        assert [(m.bookmark, m.deliveries) for m in again] == [(sent[1], 2), (sent[2], 2)]
        w2.ack_many(again)


def test_subscribe_errors_are_raised_clearly(tmp_path):
    cfg = Config(data=str(tmp_path / "d"), bind=["tcp://127.0.0.1:0"], auto_queues=False)
    with zq.Dispatcher(cfg) as d:
        with pytest.raises(zq.UnknownQueueError):
            zq.Worker(d.endpoint, "nope", connect_timeout=5)
    with pytest.raises(zq.ConnectionLost, match="no answer"):
        zq.Worker("tcp://127.0.0.1:1", "jobs", connect_timeout=0.3)


def test_a_task_longer_than_the_dead_peer_window_loses_the_session_and_the_worker_recovers(tmp_path):
    cfg = Config(data=str(tmp_path / "d"), bind=["tcp://127.0.0.1:0"], heartbeat_ms=100, heartbeat_liveness=2)
    with zq.Dispatcher(cfg) as d, zq.connect(d.inproc, heartbeat_ms=40) as c:  # this client heartbeats in time
        c.publish_many("slow", ["x", "y"])
        with zq.Worker(d.endpoint, "slow", max_backlog=1) as w:
            x = w.get(5)
            for _ in range(8):  # a long task that says it is alive keeps its lease
                time.sleep(0.1)
                w.heartbeat()
            x.ack()
            y = w.get(5)
            assert (y.data, y.deliveries) == (b"y", 1)
            time.sleep(0.8)  # silent for 4 heartbeats: the dispatcher ends the session
            y.ack()  # of a session that is gone: dropped, the message comes back
            again = w.get(5)
            assert (again.bookmark, again.deliveries) == (y.bookmark, 2)
            again.ack()
            assert w.generation >= 2
        wait_until(lambda: c.stats()["queues"]["slow"]["acked"] == 2, what="both acked")


def test_a_worker_reconnects_after_the_dispatcher_is_killed(tmp_path):
    server = ServerProcess(tmp_path).start()
    try:
        with zq.connect(server.endpoint) as c:
            sent = c.publish_many("crash", [f"m{i}" for i in range(10)])
        with zq.Worker(server.endpoint, "crash", max_backlog=4) as w:
            done = []
            for _ in range(3):
                m = w.get(5)
                m.ack()
                done.append(m.bookmark)
            w.heartbeat()  # the acks leave now
            wait_until(lambda: stats(server.endpoint, "crash").get("acked") == 3, what="three acks")
            held = w.get(5)  # leased, not settled, when the dispatcher dies
            server.kill()
            server.start()
            got = []
            while not set(sent) <= set(done) | set(got):
                m = w.get(10)
                assert m is not None, f"no message after the restart ({got})"
                got.append(m.bookmark)
                m.ack()
        assert held.bookmark in got  # redelivered: nothing lost
        assert set(done) | set(got) == set(sent)
        assert not set(done) & set(got)  # nothing whose ack the dispatcher had came back
        # (A message taken from the old session just before the worker noticed the
        # restart may come twice: its ack went nowhere. At-least-once, as documented.)
    finally:
        server.terminate()


def test_a_wait_that_times_out_sleeps_to_its_end_rather_than_spinning(dispatcher):
    """The last fraction of a millisecond before ``get``'s deadline was once polled with a
    zero timeout, again and again: every idle wait ended in a spin of up to 1 ms, which on
    two cores took a core from everyone else (issue #34's latency tail)."""
    with zq.Worker(dispatcher.endpoint, "idle", max_backlog=4) as w:
        polls = []
        real = w._poller

        class Counting:
            def poll(self, timeout: int) -> list:
                polls.append(timeout)
                return real.poll(timeout)

            def __getattr__(self, name: str) -> object:
                return getattr(real, name)

        w._poller = Counting()
        for _ in range(10):
            started = time.monotonic()
            assert w.get(timeout=0.03) is None
            assert time.monotonic() - started >= 0.03
    # Each wait: one poll to its deadline, and at most a couple more if the poll's own
    # clock ends it a hair early (before: about 120 a wait, nearly all of them zero).
    assert len(polls) <= 30, f"{len(polls)} polls for 10 waits (zero timeouts: {polls.count(0)})"
