"""Settle and publish in one commit, end to end (real sockets, a real journal): every
client's one-call form, the fence, a refused output, the wire's bad values, rights, and
a dispatcher SIGKILLed around a transaction."""

from __future__ import annotations

import asyncio

import pytest

import zq
from zq import wire
from zq.core.settings import QueueSettings
from zq.core.transactions import derived_id
from zq.server.config import Config

from .support import raw_dealer
from .test_fencing import frames_until


@pytest.fixture
def dispatcher(tmp_path):
    queues = [QueueSettings(name="orders", lease_ms=60_000, backoff_ms=[]),
              QueueSettings(name="small", max_depth=2, overflow="reject")]
    d = zq.Dispatcher(Config(data=str(tmp_path / "d"), bind=["tcp://127.0.0.1:0"], queues=queues)).start()
    yield d
    d.stop()


def subscribed(endpoint: str, until: type = wire.DeliverRecords):  # type: ignore[no-untyped-def]
    """A bare DEALER (frames by hand, as a hostile peer) with subscription ``s`` on
    ``orders`` open, after its first ``until`` frame."""
    d = raw_dealer(endpoint)
    d.send(wire.encode(wire.Hello(1)))
    d.send(wire.encode(wire.Subscribe(1, "s", "orders", 2)))
    frames_until(d, until)
    return d


def reply_to(sock, req: int):  # type: ignore[no-untyped-def]
    while True:
        reply = frames_until(sock, wire.Reply)
        if reply.req == req:
            return reply


def drain(c: zq.Client, queue: str, n: int) -> list[zq.Message]:
    with c.subscribe(queue, max_backlog=max(n, 1)) as sub:
        got = [sub.get(5) for _ in range(n)]
        assert all(m is not None for m in got), f"{queue}: fewer than {n}"
        assert sub.get(0.2) is None, f"{queue}: more than {n}"
        sub.ack_many(got, wait=True)
    return got


def test_an_ack_with_outputs_commits_both_from_a_subscription(dispatcher):
    with zq.connect(dispatcher.endpoint) as c:
        order = c.publish("orders", b"o1")
        with c.subscribe("orders") as sub:
            msg = sub.get(5)
            verdict = msg.ack(publish=[("invoices", b"inv", {"order": "1"}), ("shipments", "ship")])
            assert verdict == "ok" and len(verdict.bookmarks) == 2
        [inv] = drain(c, "invoices", 1)
        [ship] = drain(c, "shipments", 1)
        assert (inv.data, inv.headers["order"], ship.data) == (b"inv", "1", b"ship")
        assert inv.msg_id == derived_id("orders", order, 0) and ship.msg_id == derived_id("orders", order, 1)
        assert [inv.bookmark, ship.bookmark] == verdict.bookmarks
        assert c.stats()["queues"]["orders"]["acked"] == 1
        assert c.explain("orders", order)["state"] == "not-in-queue"


def test_a_worker_commits_and_a_late_delivery_publishes_nothing(dispatcher):
    with zq.connect(dispatcher.endpoint) as c:
        c.publish("orders", b"o1")
    with zq.Worker(dispatcher.endpoint, "orders") as w:
        msg = w.get(5)
        tx = w.commit([msg], [("invoices", b"inv")])
        assert tx.committed and tx.verdicts == {msg.bookmark: "ok"} and len(tx.bookmarks) == 1
        again = msg.ack(publish=[("invoices", b"second")])  # the same delivery, settled already
        assert again == "done" and again.bookmarks == []
    with zq.connect(dispatcher.endpoint) as c:
        assert [m.data for m in drain(c, "invoices", 1)] == [b"inv"]


def test_a_stale_epoch_publishes_nothing_and_says_lost(dispatcher):
    with zq.connect(dispatcher.endpoint) as c:
        order = c.publish("orders", b"o1")
    d = subscribed(dispatcher.endpoint)
    try:
        d.send(wire.encode(wire.Transact(2, "s", "ack", [order], [7], [("invoices", [(b"x", {}, None)])])))
        answer = reply_to(d, 2)
        assert answer.data == {"committed": False, "lost": [order], "held": []}
        d.send(wire.encode(wire.Transact(3, "s", "ack", [order, 10**9], [1, 1], [("invoices", [(b"x", {}, None)])])))
        answer = reply_to(d, 3)
        assert answer.data == {"committed": False, "unknown": [10**9], "held": [order]}
    finally:
        d.close(0)
    with zq.connect(dispatcher.endpoint) as c:
        assert "invoices" not in c.stats()["queues"] or c.stats()["queues"]["invoices"]["published"] == 0


def test_an_output_its_queue_refuses_leaves_the_input_held_and_nothing_published(dispatcher):
    with zq.connect(dispatcher.endpoint) as c:
        c.publish("orders", b"o1")
        c.publish_many("small", [b"a", b"b"])
        with c.subscribe("orders") as sub:
            msg = sub.get(5)
            with pytest.raises(zq.ZqError) as refused:
                msg.ack(publish=[("invoices", b"inv"), ("small", b"c")])
            assert refused.value.code == "queue-full"
            with pytest.raises(TypeError):
                msg.ack(publish=[("invoices", 5)])
            with pytest.raises(TypeError):
                msg.ack(publish="invoices")
            with pytest.raises(zq.ZqError) as reserved:
                msg.ack(publish=[("invoices", b"x", {"zq.reason": "forged"})])
            assert reserved.value.code == "protocol"
            assert msg.ack(publish=[("invoices", b"inv")]) == "ok"  # still this consumer's to settle
        assert [m.data for m in drain(c, "invoices", 1)] == [b"inv"]
        st = c.stats()["queues"]["orders"]
        assert (st["transactions"], st["transactions_refused"]) == (1, 2)  # (the TypeErrors never left the client)


def test_a_cancel_with_outputs_puts_the_input_back(dispatcher):
    with zq.connect(dispatcher.endpoint) as c:
        c.publish("orders", b"o1")
        with c.subscribe("orders") as sub:
            msg = sub.get(5)
            assert msg.cancel(error="no stock", publish=[("alerts", b"no stock for o1")]) == "ok"
            again = sub.get(5)
            assert again.bookmark == msg.bookmark and again.deliveries == 2
            again.ack()
        assert [m.data for m in drain(c, "alerts", 1)] == [b"no stock for o1"]
        assert c.stats()["queues"]["orders"]["failed"] == 1


def test_asyncio_commits(dispatcher):
    async def run() -> list:
        async with zq.aio.connect(dispatcher.endpoint) as c:
            await c.publish("orders", b"o1")
            async with c.subscribe("orders") as sub:
                msg = await sub.get(5)
                tx = await sub.commit([msg], [("invoices", b"from asyncio")])
                return [tx.committed, tx.verdicts[msg.bookmark]]
    assert asyncio.run(run()) == [True, "ok"]
    with zq.connect(dispatcher.endpoint) as c:
        assert [m.data for m in drain(c, "invoices", 1)] == [b"from asyncio"]


@pytest.mark.parametrize("frame", [
    ["tx", 9, "s", "ack", [1], [1], [["t", [[b"x", {}, None, 5]]]]],
    ["tx", 9, "s", "ack", [1], [1], [[5, [[b"x", {}, None]]]]],
    ["tx", 9, "s", "ack", [2**64 - 1], [1], [["t", [[b"x", {}, None]]]]],  # never given out: not committed
    ["tx", 9, "s", "ack", [1], "epochs"],
    ["tx", 9, "s", "expire", [1], [1]],
    ["tx", 9, "s", "ack", [1], []],
    ["tx", 9, "s", "cancel", [1], [1], [], -5],
    ["tx", 9, "nope", "ack", [1], [1]],
])
def test_bad_transactions_on_the_wire_get_an_error_and_the_dispatcher_goes_on(dispatcher, frame):
    import msgspec
    d = subscribed(dispatcher.endpoint, wire.Subscribed)
    try:
        d.send(msgspec.msgpack.encode(frame))
        while True:
            answer = wire.server_decoder.decode(d.recv())
            if type(answer) is wire.Error or type(answer) is wire.Reply and answer.req == 9:
                break
        assert (answer.code in ("protocol", "unknown-subscription") if type(answer) is wire.Error
                else answer.data == {"committed": False, "unknown": [2**64 - 1], "held": []})
    finally:
        d.close(0)
    with zq.connect(dispatcher.endpoint) as c:
        assert "t" not in c.stats()["queues"]  # nothing of a refused transaction was published
        c.publish("orders", b"still serving")
        with c.subscribe("orders") as sub:
            assert sub.get(5).ack(publish=[("out", b"x")]) == "ok"


def test_with_replicas_ack_the_answer_waits_until_the_standbys_hold_the_settle_too(tmp_path):
    """The REPLY of a transaction is a confirmation: with ``replicas_ack`` it leaves once
    the standbys hold every record of its step (its outputs and its settle), not only
    its outputs, so a failover after the answer never loses the settle."""
    import secrets

    from .support import frames_for, raw_session, wait_until

    secret = secrets.token_hex(16)
    cfg = Config.from_dict({"cluster": {"replicas_ack": 1, "standby_secret": secret}})
    cfg.data, cfg.bind = str(tmp_path / "d"), ["tcp://127.0.0.1:0"]
    d = zq.Dispatcher(cfg).start()
    standby = raw_session(d.endpoint, "standby", RCVTIMEO=5000)
    worker = raw_session(d.endpoint, "worker", RCVTIMEO=5000)

    def report(position: int) -> int:
        standby.send(wire.encode(wire.Bounds(1, position=position, proof=secret)))
        return reply_to(standby, 1).data["next_seq"]

    try:
        worker.send(wire.encode(wire.Publish(1, "orders", [(b"o1", {}, None)])))
        assert worker.poll(300) == 0  # held: no standby has it
        end = report(10**9)  # (kept no further than the journal's end)
        order = frames_until(worker, wire.Confirm).bookmarks[0]
        worker.send(wire.encode(wire.Subscribe(2, "s", "orders", 1)))
        frames_until(worker, wire.DeliverRecords)
        worker.send(wire.encode(wire.Transact(3, "s", "ack", [order], [1], [("invoices", [(b"inv", {}, None)])])))
        with zq.connect(d.inproc) as c:
            wait_until(lambda: c.stats()["server"]["replication"]["held_confirmations"] == 1, what="the answer held")
        end = report(-1)  # (-1: no position, only the journal's end: the transaction's step is committed)
        report(end - 1)  # every record but the step's last
        assert [f for f in frames_for(worker, 0.3) if type(f) is wire.Reply] == []
        report(end)
        answer = reply_to(worker, 3)
        assert answer.data["committed"] and len(answer.data["published"][0]) == 1
        with zq.connect(d.inproc) as c:
            history = c.explain("orders", order)["history"]
            assert max(e["bookmark"] for e in history if e["kind"] == "acked") < end
    finally:
        standby.close(0)
        worker.close(0)
        d.stop()


def test_transactions_not_waited_for_leave_together_and_each_is_all_or_nothing(dispatcher):
    """``wait=False``: a worker's transactions go out together at its next flush (one TXS
    frame), each applied or not on its own; verdicts are counted as batched acks' are."""
    with zq.connect(dispatcher.endpoint) as c:
        c.publish_many("orders", [b"o1", b"o2", b"o3", b"o4"])
    with zq.Worker(dispatcher.endpoint, "orders", max_backlog=4) as w:
        msgs = w.get_many(4, timeout=5)
        assert len(msgs) == 4
        assert msgs[0].ack(publish=[("invoices", b"i1")], wait=False) is zq.client.messages.QUEUED
        msgs[1].ack(publish=[("small", b"x"), ("small", b"y"), ("small", b"z")], wait=False)  # over max_depth 2: refused
        msgs[2].ack(publish=[("invoices", b"i3")], wait=False)
        w.commit([msgs[3]], [("invoices", b"i4")], wait=False)
        w.heartbeat()  # flushes
        with zq.connect(dispatcher.endpoint) as c:
            from .support import wait_until
            wait_until(lambda: c.stats()["queues"]["orders"]["acked"] == 3, what="three committed")

            def refused_counted() -> bool:
                w.heartbeat()  # (reads what has come: the TXS frame's answer)
                return w.refused == 1

            wait_until(refused_counted, what="the refused one counted")
            assert sorted(m.data for m in drain(c, "invoices", 3)) == [b"i1", b"i3", b"i4"]
            assert c.stats()["queues"]["small"]["depth"] == 0
            assert c.explain("orders", msgs[1].bookmark)["state"] == "leased"  # nothing happened to it


def test_a_subscription_s_transactions_not_waited_for(dispatcher):
    with zq.connect(dispatcher.endpoint) as c:
        c.publish_many("orders", [b"o1", b"o2"])
        with c.subscribe("orders", max_backlog=2) as sub:
            a, b = sub.get(5), sub.get(5)
            a.ack(publish=[("invoices", b"a")], wait=False)
            sub.commit([b], [("invoices", b"b")], wait=False)
            from .support import wait_until
            wait_until(lambda: c.stats()["queues"]["orders"]["acked"] == 2, what="both committed")
        assert sorted(m.data for m in drain(c, "invoices", 2)) == [b"a", b"b"]


@pytest.mark.parametrize("txs", [
    [["ack", [1], [1], [], -1, ""]] * 4097,
    [["ack", list(range(1, 40000)), [1] * 39999, [], -1, ""], ["ack", list(range(40000, 70000)), [1] * 30000, [], -1, ""]],
    [["ack", [1], [1], [["t", [[b"x", {}, None]] * 3000]], -1, ""], ["ack", [2], [1], [["t", [[b"x", {}, None]] * 3000]], -1, ""]],
])
def test_a_txs_frame_over_its_limits_is_refused_whole(dispatcher, txs):
    import msgspec
    d = subscribed(dispatcher.endpoint, wire.Subscribed)
    try:
        d.send(msgspec.msgpack.encode(["txs", 9, "s", txs]))
        assert frames_until(d, wire.Error).code == "limit"
    finally:
        d.close(0)


# ------------------------------------------------------- found by an attack (helper 26)


def test_a_cancel_s_outputs_never_suppress_the_later_ack_s_real_output(dispatcher):
    """Cancelled with a notice to T, then acked with its real output to T: two pieces of
    work, two ids (a cancel's name the delivery it cancels). One id for both had the
    dedup window drop the real output and answer it committed."""
    with zq.connect(dispatcher.endpoint) as c:
        order = c.publish("orders", b"o1")
        with c.subscribe("orders") as sub:
            first = sub.get(5)
            assert first.cancel(delay=0, publish=[("status", b"RETRYING")]) == "ok"
            again = sub.get(5)
            done = again.ack(publish=[("status", b"SHIPPED")])
            assert done == "ok"
        got = drain(c, "status", 2)
        assert [m.data for m in got] == [b"RETRYING", b"SHIPPED"]
        assert [m.msg_id for m in got] == [f"zq:orders:{order}:0:c1", f"zq:orders:{order}:0"]
        assert done.bookmarks == [got[1].bookmark]


def test_ids_in_the_dispatcher_s_namespace_are_refused_from_clients(dispatcher):
    """A key that may publish to an output topic could publish ``zq:QUEUE:BOOKMARK:0``
    in advance, and the stage's real output would be dropped as its repeat."""
    with zq.connect(dispatcher.endpoint) as c:
        with pytest.raises(zq.ZqError) as forged:
            c.publish("invoices", b"forged", msg_id="zq:orders:99:0")
        assert forged.value.code == "protocol" and "dispatcher's" in str(forged.value)
        c.publish("orders", b"o1")
        with c.subscribe("orders") as sub:
            msg = sub.get(5)
            with pytest.raises(zq.ZqError):  # refused in the client: nothing sent
                msg.ack(publish=[("invoices", b"x", {}, "zq:mine")])
            assert msg.ack(publish=[("invoices", b"x", {}, "mine")]) == "ok"
    d = raw_dealer(dispatcher.endpoint)
    try:  # and on the wire, for a client that does not check
        d.send(wire.encode(wire.Hello(1)))
        d.send(wire.encode(wire.Publish(3, "invoices", [(b"x", {}, "zq:orders:99:0")])))
        assert frames_until(d, wire.Error).code == "protocol"
    finally:
        d.close(0)


def test_a_frame_may_make_few_queues_and_name_few_topics(dispatcher):
    """4,096 new topics in one TXS made 4,096 queues in one step: 7 s of a stalled loop
    (routing scans every queue). A frame names at most 64 topics, 16 of them new."""
    with zq.connect(dispatcher.endpoint) as c:
        order = c.publish("orders", b"o1")
    d = subscribed(dispatcher.endpoint)
    try:
        new = [(f"new.{i}", [(b"x", {}, None)]) for i in range(17)]
        d.send(wire.encode(wire.Transact(2, "s", "ack", [order], [1], new)))
        error = frames_until(d, wire.Error)
        assert error.code == "limit" and "16 output topics no queue takes yet" in error.message
        spread = [(f"orders.{i}", []) for i in range(65)]
        d.send(wire.encode(wire.TransactMany(3, "s", [("ack", [order], [1], spread[:40], -1, ""),
                                                      ("ack", [order], [1], spread[40:], -1, "")])))
        assert frames_until(d, wire.Error).code == "limit"
        d.send(wire.encode(wire.TransactMany(4, "s", [("ack", [order], [1], [], -1, "")] * 1025)))
        assert frames_until(d, wire.Error).code == "limit"
        d.send(wire.encode(wire.Transact(5, "s", "ack", [order], [1], new[:16])))
        assert reply_to(d, 5).data["committed"]  # 16 new ones may
    finally:
        d.close(0)


def test_an_error_inside_one_transaction_of_a_txs_frame_answers_that_one_only(dispatcher, monkeypatch):
    from zq.core import transactions

    real = transactions.transact

    def flaky(engine, sub_id, op, seqs, *args, **kw):  # type: ignore[no-untyped-def]
        if seqs == [second]:
            raise RuntimeError("planted")
        return real(engine, sub_id, op, seqs, *args, **kw)

    monkeypatch.setattr(transactions, "transact", flaky)
    with zq.connect(dispatcher.endpoint) as c:
        first, second = c.publish_many("orders", [b"o1", b"o2"])
    d = subscribed(dispatcher.endpoint)
    try:
        d.send(wire.encode(wire.TransactMany(2, "s", [("ack", [first], [1], [("out", [(b"1", {}, None)])], -1, ""),
                                                      ("ack", [second], [1], [("out", [(b"2", {}, None)])], -1, "")])))
        ok, failed = reply_to(d, 2).data["results"]
        assert ok["committed"] and failed["error"] == "internal"
    finally:
        d.close(0)
    with zq.connect(dispatcher.endpoint) as c:
        assert c.stats()["server"]["internal_errors"] == 1
        assert [m.data for m in drain(c, "out", 1)] == [b"1"]


def test_a_worker_cuts_its_transactions_into_frames_the_dispatcher_takes():
    from zq.client.worker import tx_frames

    def tx(n_msgs: int, topic: str = "t", size: int = 1):  # type: ignore[no-untyped-def]
        return (("ack", [1], [1], [(topic, [(b"x" * size, {}, None)] * n_msgs)], -1, ""), None)

    assert [len(f) for f in tx_frames([tx(1)] * 2500)] == [1024, 1024, 452]
    assert [len(f) for f in tx_frames([tx(3000), tx(3000), tx(10)])] == [1, 2]
    assert [len(f) for f in tx_frames([tx(1, f"t{i}") for i in range(130)])] == [64, 64, 2]
    assert [len(f) for f in tx_frames([tx(1, size=20 << 20)] * 3)] == [1, 1, 1]


def test_a_transaction_no_frame_could_carry_is_refused_in_the_client(dispatcher):
    with zq.connect(dispatcher.endpoint) as c:
        c.publish("orders", b"o1")
    with zq.Worker(dispatcher.endpoint, "orders") as w:
        msg = w.get(5)
        for outputs in ([("t", b"x")] * 4097, [(f"t{i}", b"x") for i in range(65)], [("t", b"x" * (33 << 20))]):
            with pytest.raises(zq.ZqError) as refused:
                msg.ack(publish=outputs, wait=False)
            assert refused.value.code == "limit"
        assert msg.ack(publish=[("t", b"x")]) == "ok"  # nothing was sent: still this worker's


def test_route_lookups_of_topics_nobody_takes_leave_nothing_behind():
    from zq.core import Engine
    from zq.core.routing import ROUTE_CACHE_MAX

    e = Engine([QueueSettings(name="orders")])
    assert not e.routes.covered("nobody.1") and "nobody.1" not in e.routes.cache
    for i in range(ROUTE_CACHE_MAX + 10):
        e.routes.route(f"t.{i}")
    assert len(e.routes.cache) <= ROUTE_CACHE_MAX


def test_with_security_each_transaction_needs_publish_on_its_outputs_and_new_queues_count(tmp_path):
    """Rights are a key's, checked per transaction (one forbidden output refuses that
    transaction, not the others sent with it), and the queues a frame's outputs would
    make count against the key's max_queues before anything happens (one TXS made 640
    queues past a max_queues of 5)."""
    import shutil

    import zmq.auth

    from zq.server.security import ClientSection, SecuritySection, check_section

    kdir, allowed = tmp_path / "keys", tmp_path / "allowed"
    kdir.mkdir()
    allowed.mkdir()
    keys = {}
    for name in ("server", "carol"):
        pub, sec = zmq.auth.create_certificates(str(kdir), name)
        keys[name] = (pub, sec)
        if name != "server":
            shutil.copy(pub, allowed)
    rights = {"publish": ["carol.*"], "consume": ["carol.*"], "browse": [], "claim": [], "admin": [], "max_queues": 3}
    sec = check_section(SecuritySection(secret_key=str(keys["server"][1]), allow=str(allowed),
                                        client=[ClientSection(key=str(keys["carol"][0]), name="carol", **rights)]),
                        tmp_path)
    d = zq.Dispatcher(Config(data=str(tmp_path / "d"), bind=["tcp://127.0.0.1:0"], security=sec)).start()
    curve = {"key": str(keys["carol"][1]), "server_key": str(keys["server"][0])}
    try:
        with zq.connect(d.endpoint, **curve) as c:
            c.publish_many("carol.orders", [b"o1", b"o2", b"o3"])  # carol's first queue
        with zq.Worker(d.endpoint, "carol.orders", max_backlog=3, **curve) as w:
            a, b, e = w.get_many(3, timeout=5)
            a.ack(publish=[("carol.out", b"a")], wait=False)
            b.ack(publish=[("bob.out", b"b")], wait=False)  # not carol's to publish to
            w.heartbeat()
            with pytest.raises(zq.ZqError) as over:  # 1 made + 3 more > max_queues 3
                e.ack(publish=[("carol.n1", b"x"), ("carol.n2", b"x"), ("carol.n3", b"x")])
            assert over.value.code == "limit"
            assert e.ack(publish=[("carol.out", b"e")]) == "ok"

            def answered() -> bool:
                w.heartbeat()
                return w.refused == 1

            from .support import wait_until
            wait_until(answered, what="the forbidden transaction refused alone")
        with zq.connect(d.endpoint, **curve) as c:
            assert sorted(m.data for m in drain(c, "carol.out", 2)) == [b"a", b"e"]
            assert c.stats()["queues"]["carol.orders"]["acked"] == 2
    finally:
        d.stop()


def test_an_inproc_connection_to_a_secured_embedded_dispatcher_does_not_end_it(tmp_path):
    """Reading a ZAP key off an inproc frame raised (there is no ZAP there) and ended the
    dispatcher's thread: every remote client then found nothing listening."""
    import shutil

    import zmq.auth

    from zq.server.security import ClientSection, SecuritySection, check_section

    kdir, allowed = tmp_path / "keys", tmp_path / "allowed"
    kdir.mkdir()
    allowed.mkdir()
    pub, secret = zmq.auth.create_certificates(str(kdir), "server")
    cpub, csecret = zmq.auth.create_certificates(str(kdir), "client")
    shutil.copy(cpub, allowed)
    sec = check_section(SecuritySection(secret_key=secret, allow=str(allowed),
                                        client=[ClientSection(key=cpub, name="client")]), tmp_path)
    d = zq.Dispatcher(Config(data=str(tmp_path / "d"), bind=["tcp://127.0.0.1:0"], security=sec)).start()
    try:
        raw = raw_dealer(d.inproc)
        raw.send(wire.encode(wire.Hello(1)))
        answer = wire.server_decoder.decode(raw.recv())  # refused: no key on inproc, no rights
        assert type(answer) is wire.Error and answer.code == "not-entitled"
        raw.close(0)
        with zq.connect(d.endpoint, key=csecret, server_key=pub) as c:
            assert c.publish("jobs", b"still serving") > 0
    finally:
        d.stop()
