"""Priority and sorted queues: delivery by rank, oldest first within a rank."""

import json

import msgspec

import pytest

from zq.core import QueueSettings
from zq.core.errors import ConfigError
from zq.core import records as R
from zq.core.ordering import priority_of, sort_level
from zq.journal.base import recover_engine
from zq.journal.memory_journal import MemoryJournal

from .helpers import Harness

PRIO = QueueSettings(name="jobs", priority="prio")


def order(h: Harness, queue: str = "jobs") -> list[int]:
    return [s for s, _ in h.engine.peek(queue, 1000)]


def test_the_highest_priority_goes_first_and_the_oldest_first_within_a_priority():
    h = Harness(PRIO)
    low1 = h.pub("jobs", prio="1")
    high1 = h.pub("jobs", prio="9")
    none = h.pub("jobs")  # missing: lowest
    low2 = h.pub("jobs", prio="1")
    high2 = h.pub("jobs", prio="9")
    h.drain()
    expected = high1 + high2 + low1 + low2 + none
    assert order(h) == expected
    h.sub("w", "jobs", backlog=10)
    assert h.drain() == {"w": expected}


def test_a_new_higher_priority_message_overtakes_older_ones_for_every_subscriber():
    h = Harness(PRIO)
    old = h.pub("jobs", 3, prio="2")
    h.sub("a", "jobs", backlog=1)
    h.sub("b", "jobs", backlog=1)
    first = h.drain()
    assert sorted(first["a"] + first["b"]) == old[:2]
    urgent = h.pub("jobs", prio="7")
    h.engine.ack("a", first["a"], h.now)
    assert h.drain() == {"a": urgent}  # not old[2], which waited longer
    h.engine.ack("b", first["b"], h.now)
    assert h.drain() == {"b": old[2:]}


def test_a_returned_message_keeps_its_place_among_its_priority():
    h = Harness(PRIO)
    a, b = h.pub("jobs", 2, prio="5")
    later_low = h.pub("jobs", prio="1")
    h.sub("w", "jobs", backlog=1)
    assert h.drain() == {"w": [a]}
    h.engine.cancel("w", [a], h.now)  # back in front of b
    assert h.drain() == {"w": [a]}
    h.engine.ack("w", [a], h.now)
    assert h.drain() == {"w": [b]}
    h.engine.ack("w", [b], h.now)
    assert h.drain() == {"w": later_low}


def test_price_times_quantity_the_amps_priority_example():
    """AMPS' example: ``priority = /price * /qty`` sends the largest orders first."""
    h = Harness(QueueSettings(name="orders", priority="/price * /qty"))
    orders = [(10, 5), (2.5, 100), (99, 1), (10, 50), ("7", "3")]
    seqs = [h.pub("orders", payload=json.dumps({"price": p, "qty": q}).encode())[0] for p, q in orders]
    h.sub("w", "orders", backlog=10)
    got = h.drain()["w"]
    notional = {seq: float(p) * float(q) for seq, (p, q) in zip(seqs, orders)}
    assert got == sorted(seqs, key=lambda s: (-int(notional[s]), s))
    assert got[0] == seqs[3]  # 10 x 50 = 500


def test_priorities_are_unsigned_64_bit_and_unusable_values_rank_lowest():
    assert priority_of("18446744073709551615") == 2**64 - 1
    assert priority_of(2**70) == 2**64 - 1
    assert priority_of(-5) == 0
    assert priority_of("abc") == 0
    assert priority_of(None) == 0
    assert priority_of(True) == 0
    assert priority_of(3.9) == 3
    h = Harness(PRIO)
    top = h.pub("jobs", prio=str(2**64 - 1))
    junk = h.pub("jobs", prio="high")
    neg = h.pub("jobs", prio="-3")
    one = h.pub("jobs", prio="1")
    h.drain()
    assert order(h) == top + one + junk + neg


def test_sorted_queue_delivers_in_ascending_key_order_keyless_first():
    h = Harness(QueueSettings(name="s", sort_key="k"))
    seqs = {}
    for key in ["b", "10", "a", None, "9", "b", "-1.5", None]:
        headers = {} if key is None else {"k": key}
        seqs.setdefault(key, []).extend(h.pub("s", **headers))
    h.drain()
    expected = seqs[None] + seqs["-1.5"] + seqs["9"] + seqs["10"] + seqs["a"] + seqs["b"]
    assert order(h, "s") == expected
    h.sub("w", "s", backlog=20)
    assert h.drain() == {"w": expected}


def test_sort_levels_order_numbers_numerically_and_strings_by_their_bytes():
    values = [None, -1e300, -2, 0, 0.5, 2, 10, 1e300, "", "A", "a", "ab", "b"]
    levels = [sort_level(v) for v in values]
    assert levels == sorted(levels) and len(set(levels)) == len(levels)
    assert sort_level("2") == sort_level(2) == sort_level(2.0)
    long_a, long_b = "x" * 24 + "a", "x" * 24 + "b"
    assert sort_level(long_a) == sort_level(long_b)  # beyond 24 bytes: publish order decides


def test_groups_keep_publish_order_and_compete_by_their_heads_rank():
    h = Harness(msgspec.structs.replace(PRIO, group_policy="one-in-flight"))
    g_low = h.pub("jobs", group="g", prio="1")
    g_high = h.pub("jobs", group="g", prio="9")
    mid = h.pub("jobs", prio="5")
    h.sub("w", "jobs", backlog=10)
    got = h.drain()["w"]
    # g's head (prio 1) ranks below mid; its second message waits for the first.
    assert got == mid + g_low
    h.engine.ack("w", g_low, h.now)
    assert h.drain() == {"w": g_high}


def test_filters_on_a_priority_queue_take_the_best_matching_message():
    h = Harness(PRIO)
    red_low = h.pub("jobs", prio="1", color="red")
    blue_high = h.pub("jobs", prio="9", color="blue")
    red_high = h.pub("jobs", prio="8", color="red")
    h.sub("r", "jobs", backlog=1, filter="color = 'red'")
    assert h.drain() == {"r": red_high}
    h.engine.ack("r", red_high, h.now)
    assert h.drain() == {"r": red_low}
    h.sub("b", "jobs", backlog=1)
    assert h.drain() == {"b": blue_high}


def test_lvq_and_expiration_work_on_a_priority_queue():
    h = Harness(QueueSettings(name="jobs", priority="prio", lvq_key="k", expiration_ms=1000))
    a1 = h.pub("jobs", prio="1", k="a")
    b = h.pub("jobs", prio="2", k="b")
    a2 = h.pub("jobs", prio="3", k="a")
    h.drain()
    assert order(h) == a2 + b
    assert [x for e in h.events(R.EXPIRED) for x in e.bookmarks] == a1
    h.advance(1500)
    h.advance(1500)  # past the sweep interval
    h.drain()
    assert h.engine.queues["jobs"].depth == 0
    assert sorted(x for e in h.events(R.EXPIRED) if e.reason == R.REASON_EXPIRED for x in e.bookmarks) == sorted(a2 + b)


def test_recovery_restores_the_order_and_delivery_counts():
    journal = MemoryJournal()
    settings = [QueueSettings(name="jobs", priority="prio", sort_key=None)]
    e = recover_engine(journal, settings)
    seqs = [e.publish("jobs", b"x", {"prio": str(p)}, 0) for p in (3, 7, 1, 7)]
    e.subscribe("w", "jobs", "w", 1, 0)
    out = e.drain(0)
    assert out.deliveries[0].seqs == [seqs[1]]
    journal.append(out.records)
    journal.commit(0)
    again = recover_engine(journal, settings)
    assert [s for s, _ in again.peek("jobs", 10)] == [seqs[1], seqs[3], seqs[0], seqs[2]]
    assert again.peek("jobs", 1)[0][1] == 1  # delivered once before the restart


def test_stats_show_the_kind():
    h = Harness(PRIO, QueueSettings(name="s", sort_key="/ts"))
    assert h.engine.stats()["queues"]["jobs"]["kind"] == "priority"
    assert h.engine.stats()["queues"]["s"]["kind"] == "sorted"


@pytest.mark.parametrize("kwargs, words", [
    (dict(priority="p", sort_key="k"), "not both"),
    (dict(priority="p", barrier="b = 1"), "barrier"),
    (dict(sort_key="k", browse_only=True), "browse_only"),
    (dict(priority="p", max_depth=10, overflow="ring"), "ring"),
    (dict(priority="p +"), "priority"),
])
def test_contradicting_kinds_are_refused_with_the_reason(kwargs, words):
    with pytest.raises(ConfigError, match=words):
        QueueSettings(name="q", **kwargs).validate()
