"""Fenced leases over real sockets: a settle names the delivery it settles (its epoch,
the delivery count), and one whose lease ended and went out again is never applied,
across lease expiry, another consumer, and a SIGKILLed and restarted `zq serve`."""

from __future__ import annotations

import pytest

import zq
from zq import wire
from zq.core.settings import QueueSettings
from zq.server.config import Config

from .support import ServerProcess, raw_dealer, wait_until


@pytest.fixture
def dispatcher(tmp_path):
    queues = [QueueSettings(name="jobs", lease_ms=150, max_deliveries=50)]
    d = zq.Dispatcher(Config(data=str(tmp_path / "d"), bind=["tcp://127.0.0.1:0"], queues=queues)).start()
    yield d
    d.stop()


def test_a_late_ack_after_the_lease_ended_is_lost_and_the_redelivery_settles(dispatcher):
    with zq.Publisher(dispatcher.endpoint) as p, zq.Worker(dispatcher.endpoint, "jobs") as w:
        b = p.publish("jobs", b"slow work")
        first = w.get(timeout=5)
        again = w.get(timeout=5)  # held past the lease: the same worker gets it again
        assert first is not None and again is not None
        assert (first.bookmark, first.deliveries, again.bookmark, again.deliveries) == (b, 1, b, 2)
        assert first.ack(wait=True) == "lost"  # not applied: it would have settled delivery 2
        assert again.ack(wait=True) == "ok"
        assert again.ack(wait=True) == "done"
        assert first.ack(wait=True) == "done"


def test_a_stale_ack_from_another_consumer_is_lost_and_counted(dispatcher):
    with zq.Publisher(dispatcher.endpoint) as p:
        b = p.publish("jobs", b"x")
    slow = zq.connect(dispatcher.endpoint)
    sub = slow.subscribe("jobs", max_backlog=1)
    try:
        m_slow = sub.get(timeout=5)
        assert m_slow is not None and m_slow.deliveries == 1
        sub.replace(filter="kind = 'never'")  # keeps its lease, takes nothing more
        with zq.Worker(dispatcher.endpoint, "jobs") as fast:
            m_fast = fast.get(timeout=5)  # after the slow lease ended
            assert m_fast is not None and (m_fast.bookmark, m_fast.deliveries) == (b, 2)
            m_slow.ack()  # batched, not waited for: reported back as REFUSED lost
            wait_until(lambda: sub.lost == 1, timeout=10, what="the stale ack to be reported lost")
            assert m_fast.ack(wait=True) == "ok"
        assert sub.refused == 1
    finally:
        slow.close()
    with zq.connect(dispatcher.endpoint) as c:
        q = c.stats()["queues"]["jobs"]
        assert (q["acked"], q["depth"], q["leased"]) == (1, 0, 0)


def test_batched_worker_settles_count_what_was_lost(dispatcher):
    with zq.Publisher(dispatcher.endpoint) as p, zq.Worker(dispatcher.endpoint, "jobs", max_backlog=4) as w:
        sent = p.publish_many("jobs", [b"a", b"b", b"c"])
        firsts = [w.get(timeout=5) for _ in sent]
        seconds = [w.get(timeout=5) for _ in sent]  # every lease ended once
        assert all(m is not None for m in firsts + seconds)
        assert [m.deliveries for m in seconds] == [2, 2, 2]
        w.ack_many(firsts)
        assert w.ack_many(seconds, wait=True) == {b: "ok" for b in sent}  # the batched stale acks went first
        assert w.lost == 3


def frames_until(sock, kind):  # type: ignore[no-untyped-def]
    while True:
        msg = wire.server_decoder.decode(sock.recv())
        if type(msg) is kind:
            return msg


def test_epochs_survive_a_sigkilled_dispatcher(tmp_path):
    """The delivery count is journaled: after a SIGKILL and a restart the redelivery has
    the next epoch, and a settle naming the one before it is not applied."""
    server = ServerProcess(tmp_path).start()
    try:
        with zq.Publisher(server.endpoint) as p:
            b = p.publish("jobs", b"survives")
        raw = raw_dealer(server.endpoint)
        raw.send(wire.encode(wire.Hello(wire.PROTOCOL_VERSION, "raw")))
        raw.send(wire.encode(wire.Subscribe(1, "s", "jobs", 1)))
        first = frames_until(raw, wire.DeliverRecords)
        assert first.deliveries == [1]
        raw.close(0)
        server.kill()
        server.start()
        raw = raw_dealer(server.endpoint)
        raw.send(wire.encode(wire.Hello(wire.PROTOCOL_VERSION, "raw")))
        raw.send(wire.encode(wire.Subscribe(1, "s", "jobs", 1)))
        again = frames_until(raw, wire.DeliverRecords)
        assert again.deliveries == [2]
        raw.send(wire.encode(wire.Ack("s", [b], [1], 7)))
        assert frames_until(raw, wire.Reply).data == {"ok": [], "lost": [b]}
        raw.send(wire.encode(wire.Ack("s", [b], [2], 8)))
        assert frames_until(raw, wire.Reply).data == {"ok": [b]}
        raw.close(0)
    finally:
        assert "Traceback" not in server.terminate()


def test_bad_epochs_get_clear_answers_and_the_dispatcher_goes_on(dispatcher):
    with zq.Publisher(dispatcher.endpoint) as p:
        b = p.publish("jobs", b"x")
    raw = raw_dealer(dispatcher.endpoint)
    try:
        raw.send(wire.encode(wire.Hello(wire.PROTOCOL_VERSION, "raw")))
        raw.send(wire.encode(wire.Subscribe(1, "s", "jobs", 4)))
        assert frames_until(raw, wire.DeliverRecords).deliveries == [1]
        raw.send(wire.encode(wire.Ack("s", [b, b], [1], 2)))  # epochs of another length
        assert frames_until(raw, wire.Error).code == "protocol"
        for epoch in (0, 2**64 - 1, -(2**63), 65537):  # never this delivery's count
            raw.send(wire.encode(wire.Extend("s", [b], 1000, [epoch], 3)))
            assert frames_until(raw, wire.Reply).data == {"ok": [], "lost": [b]}
        raw.send(b"\x95\xa3ack\xa1s\x91\x01\xa1x\x00")  # epochs of the wrong type
        assert frames_until(raw, wire.Error).code == "protocol"
        raw.send(wire.encode(wire.Ack("s", [0, 2**64 - 1, 10**6], [1, 1, 1], 4)))
        assert frames_until(raw, wire.Reply).data == {"ok": [], "unknown": [0, 2**64 - 1, 10**6]}
        raw.send(wire.encode(wire.Ack("nope", [b], [1], 5)))
        assert frames_until(raw, wire.Reply).data == {"ok": [], "unknown-subscription": [b]}
        raw.send(wire.encode(wire.Ack("s", [b], [1], 6)))
        assert frames_until(raw, wire.Reply).data == {"ok": [b]}
    finally:
        raw.close(0)


def test_asyncio_code_awaits_the_verdicts(dispatcher):
    import asyncio

    import zq.aio

    async def main() -> tuple[int, dict, dict]:
        async with zq.aio.connect(dispatcher.endpoint) as c:
            b = await c.publish("jobs", b"async")
            async with c.subscribe("jobs", max_backlog=1) as sub:
                first = await sub.get(timeout=5)
                again = await sub.get(timeout=5)  # after the lease ended
                assert first is not None and again is not None and again.deliveries == 2
                with pytest.raises(ValueError):
                    await sub.settle("extend", [again])
                return b, await sub.settle("ack", [first]), await sub.settle("ack", [again])

    b, stale, live = asyncio.run(main())
    assert (stale, live) == ({b: "lost"}, {b: "ok"})
