"""zq.Publisher: the single-threaded publisher, against real dispatchers over real sockets."""

from __future__ import annotations

import time

import pytest

import zq
from zq.server.config import Config
from zq.core import QueueSettings

from .support import ServerProcess


@pytest.fixture
def dispatcher(tmp_path):
    d = zq.Dispatcher(Config(data=str(tmp_path / "d"), bind=["tcp://127.0.0.1:0"])).start()
    yield d
    d.stop()


def test_publishes_are_durable_in_order_and_reach_a_worker(dispatcher):
    with zq.Publisher(dispatcher.endpoint, name="pub") as p:
        one = p.publish("jobs", b"first", group="g1", headers={"k": "v"})
        many = p.publish_many("jobs", [f"m{i}" for i in range(5000)])  # several frames, a window of them in flight
    assert many == list(range(many[0], many[0] + 5000)) and many[0] > one
    with zq.Worker(dispatcher.endpoint, "jobs", max_backlog=256) as w:
        first = w.get(5)
        assert (first.bookmark, first.data, first.group, first.headers["k"]) == (one, b"first", "g1", "v")
        first.ack()
        got = []
        while len(got) < 5000:
            batch = w.get_many(256, timeout=5)
            assert batch, f"stalled after {len(got)}"
            got += [m.bookmark for m in batch]
            w.ack_many(batch)
    assert got == many


def test_errors_are_raised_and_the_session_goes_on(tmp_path):
    cfg = Config(data=str(tmp_path / "d"), bind=["tcp://127.0.0.1:0"], auto_queues=False, max_message_bytes=1024,
                 queues=[QueueSettings(name="jobs")])
    with zq.Dispatcher(cfg) as d, zq.Publisher(d.endpoint) as p:
        with pytest.raises(zq.ProtocolError, match="reserved"):
            p.publish("jobs", b"x", headers={"zq.mine": "1"})
        with pytest.raises(zq.LimitError):
            p.publish("jobs", b"x" * 2048)
        assert p.publish("jobs", b"fine") > 0  # the same session, still serving
    with pytest.raises(zq.ConnectionLost, match="no answer"):
        zq.Publisher("tcp://127.0.0.1:1", connect_timeout=0.3)
    p.close()
    with pytest.raises(zq.ConnectionLost, match="closed"):
        p.publish("jobs", b"late")


def test_an_idle_publisher_outlives_its_session_and_a_killed_dispatcher(tmp_path):
    cfg = tmp_path / "zq.toml"
    cfg.write_text('[server]\nheartbeat = "100ms"\nheartbeat_liveness = 2\n')
    server = ServerProcess(tmp_path, config=cfg).start()
    try:
        with zq.Publisher(server.endpoint) as p:
            a = p.publish("crash", b"a")
            time.sleep(0.6)  # silent past the dead-peer window: the dispatcher ends the session
            b = p.publish("crash", b"b")  # told "no session", opens a new one and resends
            assert p.generation == 2
            server.kill()
            server.start()
            c = p.publish("crash", b"c", timeout=20)  # a new dispatcher: a new session
            assert p.generation == 3
        with zq.Worker(server.endpoint, "crash", max_backlog=8) as w:
            got = {}
            while len(got) < 3:
                m = w.get(5)
                assert m is not None, f"only {sorted(got)} after the restart"
                got[m.bookmark] = m.data
                m.ack()
        assert got == {a: b"a", b: b"b", c: b"c"}  # every confirmed message survived the SIGKILL
    finally:
        server.terminate()
