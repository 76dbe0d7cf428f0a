"""Queue kinds over the wire: overflow policies (and what else the queue-kinds issue
adds). Real sockets, a real LMDB journal, an embedded dispatcher."""

from __future__ import annotations

import pytest

import zq
from zq.server.config import Config
from zq.core.settings import QueueSettings

from zq.client import Client
from zq.client.worker import Worker

from .support import ServerProcess, wait_until


def server_with_config(tmp_path, toml: str) -> ServerProcess:  # type: ignore[no-untyped-def]
    """A real `zq serve` process reading ``toml`` as its zq.toml."""
    cfg = tmp_path / "zq.toml"
    cfg.write_text(toml)
    return ServerProcess(tmp_path, config=cfg).start()


def dispatcher_with(tmp_path, *queues: QueueSettings):  # type: ignore[no-untyped-def]
    return zq.Dispatcher(Config(data=str(tmp_path / "d"), bind=["tcp://127.0.0.1:0"], queues=list(queues))).start()


def test_flow_control_withholds_confirmations_until_the_queue_drains(tmp_path):
    d = dispatcher_with(tmp_path, QueueSettings(name="jobs", max_depth=5, overflow="flow-control", resume_percent=60))
    try:
        with zq.connect(d.inproc) as c:
            c.publish_many("jobs", [f"m{i}" for i in range(5)])
            late = c.publish_async("jobs", b"sixth")
            # A stats reply that counts the sixth comes after its confirmation would have.
            wait_until(lambda: c.stats()["queues"]["jobs"]["published"] == 6, what="the sixth journaled")
            assert not late.done()
            assert c.stats()["queues"]["jobs"]["overflow"]["over"] is True
            with c.subscribe("jobs", max_backlog=10) as sub:
                for _ in range(3):
                    sub.get(5).ack()
                assert late.result(10) > 0  # 3 of 5 held: at 60 % the confirmation flows
    finally:
        d.stop()


def test_reject_and_ring_over_the_wire(tmp_path):
    d = dispatcher_with(tmp_path, QueueSettings(name="strict", max_depth=2),
                        QueueSettings(name="ticks", max_depth=2, overflow="ring", dead_letter="ticks.old"))
    try:
        with zq.connect(d.inproc) as c:
            c.publish_many("strict", ["a", "b"])
            with pytest.raises(zq.LimitError) as err:
                c.publish("strict", b"c")
            assert err.value.code == "queue-full" and "overflow = reject" in str(err.value)
            c.publish_many("ticks", ["1", "2", "3", "4"])
            assert [m["data"] for m in c.peek("ticks")] == [b"3", b"4"]
            wait_until(lambda: c.stats()["queues"]["ticks.old"]["depth"] == 2, what="dropped ticks dead-lettered")
            assert {m["headers"]["zq.reason"] for m in c.peek("ticks.old")} == {"overflow"}
    finally:
        d.stop()


def test_a_last_value_queue_over_the_wire_and_across_a_restart(tmp_path):
    server = server_with_config(tmp_path, '[[queue]]\nname = "prices"\nlvq_key = "symbol"\n')
    try:
        with zq.connect(server.endpoint) as c:
            for sym, px in [("A", "1"), ("B", "5"), ("A", "2"), ("A", "3")]:
                c.publish("prices", px, headers={"symbol": sym})
            latest = {m["headers"]["symbol"]: m["data"] for m in c.peek("prices")}
            assert latest == {"A": b"3", "B": b"5"}  # browsing shows the latest value per key
            assert c.stats()["queues"]["prices"]["replaced"] == 2
            assert c.stats()["queues"]["prices"]["kind"] == "lvq"  # zq stats shows "prices (lvq)"
        server.kill()
        server.start()
        with zq.connect(server.endpoint) as c:
            assert [m["data"] for m in c.peek("prices")] == [b"5", b"3"]
    finally:
        server.terminate()


def test_a_barrier_over_the_wire_reaches_every_subscriber_after_everything_before_it(tmp_path):
    d = dispatcher_with(tmp_path, QueueSettings(name="orders", barrier="kind = 'end-of-day'"))
    try:
        with zq.connect(d.endpoint) as c, zq.connect(d.endpoint) as c2:
            c.publish_many("orders", ["o1", "o2"], headers={"kind": "order"})
            c.publish("orders", b"EOD", headers={"kind": "end-of-day"})
            c.publish("orders", b"o3", headers={"kind": "order"})
            with c.subscribe("orders", max_backlog=5) as a, c2.subscribe("orders", max_backlog=5) as b:
                first = [m for m in (a.get(2), b.get(0.2), a.get(0.2), b.get(0.2)) if m is not None]
                assert sorted(m.data for m in first) == [b"o1", b"o2"]  # EOD and o3 wait
                for m in first:
                    m.ack()
                eod_a, eod_b = a.get(5), b.get(5)
                assert (eod_a.data, eod_a.deliveries, eod_b.data) == (b"EOD", 0, b"EOD")  # to both, no lease
                eod_a.ack()  # nothing to settle: a no-op
                after = a.get(2) or b.get(2)
                assert after.data == b"o3"
                after.ack()
            assert c.stats()["queues"]["orders"]["barriers"] == {"waiting": 0, "released": 1}
    finally:
        d.stop()


def test_browse_only_over_the_wire(tmp_path):
    d = dispatcher_with(tmp_path, QueueSettings(name="feed", browse_only=True))
    try:
        with zq.connect(d.endpoint) as c, zq.connect(d.endpoint) as c2:
            c.publish_many("feed", ["a", "b", "c"])
            with c.subscribe("feed", max_backlog=2) as one, c2.subscribe("feed", max_backlog=5) as two:
                seen_one = []
                for _ in range(3):
                    m = one.get(5)
                    seen_one.append(m.data)
                    m.ack()  # returns credit; the message stays
                seen_two = [two.get(5).data for _ in range(3)]
            assert seen_one == seen_two == [b"a", b"b", b"c"]
            assert c.stats()["queues"]["feed"]["depth"] == 3
    finally:
        d.stop()


def test_priority_and_sorted_queues_over_the_wire_and_across_a_restart(tmp_path):
    server = server_with_config(tmp_path, '[[queue]]\nname = "orders"\npriority = "/price * /qty"\n')
    orders = [(10, 5), (2, 100), (99, 1), (10, 50)]  # notional 50, 200, 99, 500
    try:
        with zq.connect(server.endpoint) as c:
            c.create_queue("events", sort_key="ts")  # a run-time queue survives restarts too
            for price, qty in orders:
                c.publish("orders", f'{{"price": {price}, "qty": {qty}}}')
            for ts in ["2026-11-22T10:00:03", "2026-11-22T10:00:01", "2026-11-22T10:00:02"]:
                c.publish("events", ts, headers={"ts": ts})
            assert c.stats()["queues"]["orders"]["kind"] == "priority"
            with c.subscribe("orders", max_backlog=1) as sub:
                top = sub.get(5)
                assert top.data == b'{"price": 10, "qty": 50}'
                top.ack()
                held = sub.get(5)  # 2 x 100, leased when the server dies
                assert held.data == b'{"price": 2, "qty": 100}'
        server.kill()
        server.start()
        with zq.connect(server.endpoint) as c:
            assert [m["data"] for m in c.peek("orders")] == [
                b'{"price": 2, "qty": 100}', b'{"price": 99, "qty": 1}', b'{"price": 10, "qty": 5}']
            with c.subscribe("events", max_backlog=3) as sub:
                got = [sub.get(5) for _ in range(3)]
                assert [m.data for m in got] == [b"2026-11-22T10:00:01", b"2026-11-22T10:00:02", b"2026-11-22T10:00:03"]
                for m in got:
                    m.ack()
            assert c.stats()["queues"]["events"]["kind"] == "sorted"
    finally:
        server.terminate()


def test_target_queue_depth_over_the_wire_and_across_a_restart(tmp_path):
    server = server_with_config(tmp_path, '[[queue]]\nname = "deep"\ntarget_queue_depth = 5\nallow_ack_unleased = true\n')
    try:
        with zq.connect(server.endpoint) as c:
            seqs = c.publish_many("deep", [f"m{i}" for i in range(40)])
            stats = c.stats()["queues"]["deep"]
            assert (stats["depth"], stats["inactive"], stats["kind"]) == (5, 35, "tqd=5")
            assert len(c.peek("deep", limit=100)) == 5  # views count the active part only
            with c.subscribe("deep", max_backlog=2) as sub:
                m = sub.get(5)
                m.ack()
                sub.ack_unleased([seqs[30]])  # still journal-only: remembered, journaled
                wait_until(lambda: c.stats()["queues"]["deep"]["acked"] == 2, what="the early ack")
            taken = [m.bookmark, seqs[30]]
        server.kill()
        server.start()
        with zq.connect(server.endpoint) as c:
            stats = c.stats()["queues"]["deep"]
            assert (stats["depth"], stats["inactive"]) == (5, 33)
            with c.subscribe("deep", max_backlog=4) as sub:
                while len(taken) < 40:
                    m = sub.get(10)
                    assert m is not None, f"stalled after {len(taken)}"
                    taken.append(m.bookmark)
                    m.ack()
            assert sorted(taken) == seqs and taken[2:] == [s for s in seqs[1:] if s != seqs[30]]  # in order, once
            wait_until(lambda: c.stats()["queues"]["deep"]["inactive"] == 0, what="inactive part drained")
    finally:
        server.terminate()


def test_message_group_and_peek_follow_the_queues_group_header(tmp_path):
    """A queue grouping by `customer`: msg.group and peek's group read that header
    (they read `group`, which this queue ignores, and showed null)."""
    cfg = tmp_path / "zq.toml"
    cfg.write_text('[[queue]]\nname = "bycust"\ngroup_header = "customer"\n')
    server = ServerProcess(tmp_path, config=cfg).start()
    try:
        with Client(server.endpoint) as c:
            c.publish("bycust", "o1", headers={"customer": "acme"})
            assert [m["group"] for m in c.peek("bycust")] == ["acme"]
            with c.subscribe("bycust") as sub:
                msg = sub.get(5)
                assert msg.group == "acme" and sub.group_header == "customer"
                msg.ack()
            c.publish("bycust", "o2", headers={"customer": "zeta"})
        with Worker(server.endpoint, "bycust") as w:
            msg = w.get(timeout=5)
            assert msg is not None and msg.group == "zeta"
            msg.ack()
            w.heartbeat()
    finally:
        assert "Traceback" not in server.terminate()
