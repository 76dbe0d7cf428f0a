"""Barrier messages (the AMPS walkthrough): a barrier waits for everything before it
to be acknowledged, nothing after it overtakes it, then every matching subscriber
gets it, without a lease, and it leaves the queue."""

from zq.core import QueueSettings
from zq.core import records as R
from zq.journal.base import recover_engine
from zq.journal.memory_journal import MemoryJournal

from .helpers import Harness

Q = QueueSettings(name="orders", barrier="kind = 'end-of-day'", dead_letter="orders.dead")


def deliveries(h):  # type: ignore[no-untyped-def]
    out = h.engine.drain(h.now)
    h.records.extend(out.records)
    return [(d.sub_id, d.seqs, d.deliveries) for d in out.deliveries]


def test_the_amps_barrier_walkthrough():
    h = Harness(Q)
    m1, m2 = h.pub("orders", 2, kind="order")
    b = h.pub("orders", kind="end-of-day")[0]
    m3 = h.pub("orders", kind="order")[0]
    h.sub("a", "orders", backlog=5)
    h.sub("b", "orders", backlog=5, filter="kind = 'order'")
    got = deliveries(h)
    sent = sorted(s for _, seqs, _ in got for s in seqs)
    assert sent == [m1, m2]  # the barrier and everything after it wait
    holder = {s: sub for sub, seqs, _ in got for s in seqs}
    h.engine.ack(holder[m1], [m1], h.now)
    assert deliveries(h) == []  # m2 is still out
    h.engine.ack(holder[m2], [m2], h.now)
    got = deliveries(h)
    # "a" (no filter) gets the barrier, without a lease (deliveries 0); "b" does not match
    # it, but paused too; then m3 flows, after the barrier.
    assert got[0] == ("a", [b], [0])
    assert [s for _, seqs, _ in got[1:] for s in seqs] == [m3]
    assert b not in h.engine.queues["orders"].lease_of
    assert [e.reason for e in h.records if type(e) is R.Event and b in e.bookmarks and e.kind == R.EXPIRED] == ["barrier"]
    assert "orders.dead" not in h.engine.queues  # a released barrier is not a dead letter
    assert h.engine.stats()["queues"]["orders"]["barriers"] == {"waiting": 0, "released": 1}


def test_a_barrier_does_not_count_toward_backlog_and_survives_recovery():
    journal = MemoryJournal()
    e = recover_engine(journal, [Q])
    e.publish("orders", b"", {"kind": "order"}, 0)
    b = e.publish("orders", b"", {"kind": "end-of-day"}, 0)
    e.subscribe("s", "orders", "c", 1, 0)
    out = e.drain(0)
    journal.append(out.records)
    journal.commit(0)
    again = recover_engine(journal, [Q])
    assert again.queues["orders"].barrier.waiting == [b]
    again.subscribe("s", "orders", "c", 1, 0)
    first = again.drain(0).deliveries[0].seqs
    again.ack("s", first, 0)
    out = again.drain(0)
    assert [(d.seqs, d.deliveries) for d in out.deliveries] == [([b], [0])]
    assert again.queues["orders"].subs[0].used == 0  # no credit taken
