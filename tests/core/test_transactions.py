"""Settle and publish in one commit (zq.core.transactions): every input must be the live
delivery and every output one its topic takes, or nothing happens; outputs precede the
settle in the journal, and carry ids derived from the input unless given."""

import pytest

from zq.core import QueueSettings
from zq.core import records as R
from zq.core.errors import LimitError, ProtocolError, QueueFullError, ReservedNameError
from zq.core.transactions import derived_id

from .helpers import Harness


def orders(**kw) -> QueueSettings:
    kw.setdefault("backoff_ms", [])
    kw.setdefault("lease_ms", 10_000)
    return QueueSettings(name="orders", max_per_subscription_backlog=10, **kw)


def taken(h: Harness, n: int = 1) -> list[int]:
    seqs = h.pub("orders", n)
    h.sub("w", "orders", n)
    assert h.drain() == {"w": seqs}
    return seqs


def messages(h: Harness, topic: str) -> list[R.Message]:
    return [r for r in h.records if type(r) is R.Message and r.topic == topic]


def test_an_ack_with_outputs_publishes_them_and_acks_the_input_in_one_step_outputs_first():
    h = Harness(orders())
    [order] = taken(h)
    h.records = []
    refused, published = h.engine.transact("w", "ack", [order], [1], [("invoices", [(b"inv", {"k": "v"}, None)]),
                                                                     ("shipments", [(b"s1", {}, None), (b"s2", {}, "mine")])],
                                           h.now)
    h.drain()
    assert refused == {}
    [[inv], [s1, s2]] = published
    assert [m.msg_id for m in messages(h, "invoices")] == [derived_id("orders", order, 0)]
    assert [m.msg_id for m in messages(h, "shipments")] == [derived_id("orders", order, 1), "mine"]
    [acked] = h.events(R.ACKED)
    assert acked.bookmarks == [order]
    assert max(inv, s1, s2) < acked.seq  # any prefix of the journal holding the settle holds the outputs
    assert h.engine.queues["orders"].acked == 1 and h.engine.queues["orders"].depth == 0
    assert h.engine.queues["invoices"].depth == 1 and h.engine.queues["shipments"].depth == 2


def test_a_delivery_no_longer_live_publishes_nothing_and_settles_nothing():
    h = Harness(orders(lease_ms=100))
    [order] = taken(h)
    h.advance(100)  # the lease ends; the order goes again (epoch 2)
    assert h.drain() == {"w": [order]}
    h.records = []
    refused, published = h.engine.transact("w", "ack", [order], [1], [("invoices", [(b"inv", {}, None)])], h.now)
    h.drain()
    assert refused == {"lost": [order]} and published == []
    assert messages(h, "invoices") == [] and h.events(R.ACKED) == []
    assert "invoices" not in h.engine.queues or h.engine.queues["invoices"].depth == 0
    assert h.engine.queues["orders"].lost_settles == 1
    refused, _ = h.engine.transact("w", "ack", [order], [2], [("invoices", [(b"inv", {}, None)])], h.now)
    assert refused == {}  # the live delivery's


def test_one_input_not_live_among_several_stops_the_whole_transaction():
    h = Harness(orders())
    a, b = taken(h, 2)
    h.engine.ack("w", [b], h.now, [1])
    h.drain()
    h.records = []
    refused, published = h.engine.transact("w", "ack", [a, b, 999_999], [1, 1, 1], [("out", [(b"x", {}, None)])], h.now)
    h.drain()
    assert refused == {"done": [b], "unknown": [999_999]} and published == []
    assert h.records == [] and h.engine.queues["orders"].lease_of.keys() == {a}


def test_a_bad_output_raises_before_anything_happens():
    h = Harness(orders(), QueueSettings(name="sink", topics=r"sink\..*"))
    [order] = taken(h)
    h.records = []
    with pytest.raises(LimitError):
        h.engine.transact("w", "ack", [order], [1], [("ok", [(b"x", {}, None)]), ("big", [(b"x" * 100, {}, None)])],
                          h.now, max_message_bytes=10)
    with pytest.raises(ProtocolError):  # a reserved header, in the second output
        h.engine.transact("w", "ack", [order], [1], [("ok", [(b"x", {}, None)]), ("b", [(b"x", {"zq.x": "1"}, None)])],
                          h.now)
    with pytest.raises(ReservedNameError):  # a queue's own name it does not take as a topic
        h.engine.transact("w", "ack", [order], [1], [("ok", [(b"x", {}, None)]), ("sink", [(b"x", {}, None)])], h.now)
    with pytest.raises(ProtocolError):
        h.engine.transact("w", "ack", [order], [1], [("ok", [(b"x", {}, None)]), ("", [(b"x", {}, None)])], h.now)
    h.drain()
    assert h.records == [] and h.engine.queues["orders"].lease_of.keys() == {order}


def test_two_outputs_that_together_overflow_a_reject_queue_are_refused_whole():
    full = QueueSettings(name="sink", topics=r"sink\..*", max_depth=3, overflow="reject")
    h = Harness(orders(), full)
    [order] = taken(h)
    h.records = []
    two = [(b"x", {}, None), (b"y", {}, None)]
    with pytest.raises(QueueFullError):  # each fits alone (2 of 3), not together
        h.engine.transact("w", "ack", [order], [1], [("sink.a", two), ("sink.b", two)], h.now)
    h.drain()
    assert h.records == [] and h.engine.queues["sink"].depth == 0
    refused, [[x, y], [z]] = h.engine.transact("w", "ack", [order], [1], [("sink.a", two), ("sink.b", two[:1])], h.now)
    assert refused == {} and h.engine.queues["sink"].depth == 3


def test_outputs_of_one_transaction_may_not_pass_a_group_ceiling_together():
    h = Harness(orders(), QueueSettings(name="g", topics=r"g\..*", max_groups=2))
    [order] = taken(h)
    with pytest.raises(LimitError):
        h.engine.transact("w", "ack", [order], [1], [("g.a", [(b"1", {"group": "a"}, None), (b"2", {"group": "b"}, None)]),
                                                    ("g.b", [(b"3", {"group": "c"}, None)])], h.now)
    assert h.engine.queues["g"].depth == 0


def test_a_redelivered_input_producing_the_same_outputs_is_absorbed_by_the_dedup_window():
    """The outputs of a first attempt stored without its settle (a standby's copy cut
    between them, or the settle's answer lost): the input goes again, and the same
    outputs under the same derived ids are not stored twice."""
    h = Harness(orders(lease_ms=100))
    h.engine.admission.find_id = lambda topic, msg_id: next(  # the journal's id index
        ((m.seq, m.ts_ms) for m in h.journaled.values() if (m.topic, m.msg_id) == (topic, msg_id)), None)
    [order] = taken(h)
    first = h.engine.publish_many("invoices", [(b"inv", {}, derived_id("orders", order, 0))], h.now)
    h.advance(100)
    assert h.drain() == {"w": [order]}  # delivered again (epoch 2)
    h.records = []
    refused, [again] = h.engine.transact("w", "ack", [order], [2], [("invoices", [(b"inv", {}, None)])], h.now)
    h.drain()
    assert refused == {} and again == first
    assert messages(h, "invoices") == [] and h.engine.queues["invoices"].depth == 1
    assert [e.bookmarks for e in h.events(R.ACKED)] == [[order]]


def test_a_cancel_with_outputs_puts_the_input_back_and_publishes():
    h = Harness(orders())
    [order] = taken(h)
    refused, [[alert]] = h.engine.transact("w", "cancel", [order], [1], [("alerts", [(b"failed", {}, None)])], h.now,
                                           delay_ms=0, error="boom")
    assert refused == {}
    q = h.engine.queues["orders"]
    assert q.depth == 1 and q.cancelled == 1 and h.engine.queues["alerts"].depth == 1
    h.drain()
    [cancelled] = h.events(R.CANCELLED)
    assert cancelled.reason == "boom" and alert < cancelled.seq


def test_a_transaction_without_outputs_is_a_fenced_settle():
    h = Harness(orders())
    [order] = taken(h)
    assert h.engine.transact("w", "ack", [order], [1], [], h.now) == ({}, [])
    assert h.engine.queues["orders"].acked == 1


@pytest.mark.parametrize("op, seqs, epochs, outputs, kw, error", [
    ("expire", [1], [1], [], {}, ProtocolError),
    ("ack", [], [], [], {}, ProtocolError),
    ("ack", [1], [], [], {}, ProtocolError),  # unfenced
    ("ack", [1, 1], [1, 1], [], {}, ProtocolError),
    ("ack", [1], [1], [("t", [])] * 65, {}, LimitError),
    ("ack", [1], [1], [("t", [(b"", {}, None)] * 4097)], {}, LimitError),
    ("ack", [1] * 65_537, [1] * 65_537, [], {}, LimitError),
    ("cancel", [1], [1], [], {"delay_ms": -2}, ProtocolError),
    ("cancel", [1], [1], [], {"delay_ms": 2**63}, ProtocolError),
    ("cancel", [1], [1], [], {"error": "e" * 1025}, ProtocolError),
    ("ack", [1], [1], [("x" * 481, [(b"", {}, None)])], {}, LimitError),
])
def test_bad_shapes_are_refused_before_anything_happens(op, seqs, epochs, outputs, kw, error):
    h = Harness(orders())
    [order] = taken(h)
    h.records = []
    with pytest.raises(error):
        h.engine.transact("w", op, seqs, epochs, outputs, h.now, **kw)
    h.drain()
    assert h.records == [] and h.engine.queues["orders"].lease_of.keys() == {order}


def test_a_browse_only_queue_has_nothing_to_settle_in_a_transaction():
    h = Harness(QueueSettings(name="view", browse_only=True))
    seq = h.pub("view")[0]
    h.sub("w", "view", 1)
    h.drain()
    with pytest.raises(ProtocolError):
        h.engine.transact("w", "ack", [seq], [1], [], h.now)


def test_a_copy_of_the_journal_cut_between_the_outputs_and_the_settle_recovers_to_exactly_once():
    """A standby copies the journal in windows that may end inside a transaction's
    records; the outputs come first, so a promoted copy holds either all of it or the
    outputs without the settle. Then the input goes again, and the stage's same outputs
    (same derived ids) are absorbed: each output stored once, the input settled once."""
    from zq.journal.base import recover_engine
    from zq.journal.memory_journal import MemoryJournal

    h = Harness(orders())
    [order] = taken(h)
    outputs = [("invoices", [(b"inv", {}, None)]), ("shipments", [(b"ship", {}, None)])]
    refused, published = h.engine.transact("w", "ack", [order], [1], outputs, h.now)
    h.drain()
    [acked] = h.events(R.ACKED)
    copy = MemoryJournal()
    copy.append([r for r in h.records if getattr(r, "seq", -1) < acked.seq])  # the window ends before the settle
    copy.commit(h.now)
    promoted = Harness(orders())
    promoted.engine = recover_engine(copy, [orders()])
    promoted.journaled.update({seq: m for seq, m in h.journaled.items() if seq < acked.seq})
    promoted.sub("w2", "orders", 1)
    assert promoted.drain() == {"w2": [order]}  # the input goes again: its settle was not in the copy
    assert promoted.engine.queues["invoices"].depth == 1  # its outputs were
    promoted.records = []
    again, republished = promoted.engine.transact("w2", "ack", [order], [2], outputs, promoted.now)
    promoted.drain()
    assert again == {} and republished == published  # absorbed: the first ones answer
    assert [r for r in promoted.records if type(r) is R.Message] == []
    assert [e.bookmarks for e in promoted.events(R.ACKED)] == [[order]]
    assert promoted.engine.queues["invoices"].depth == 1 and promoted.engine.queues["shipments"].depth == 1
