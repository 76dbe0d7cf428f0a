"""Selecting and reaching messages over the wire: filters, views, claims, replay,
dedup, management. Real sockets, a real LMDB journal, an embedded dispatcher (or a
`zq serve` process where a restart matters)."""

from __future__ import annotations

import json

import pytest

import zq
from zq.config import Config
from zq.core.errors import ZqError

from .support import wait_until


@pytest.fixture
def dispatcher(tmp_path):
    d = zq.Dispatcher(Config(data=str(tmp_path / "d"), bind=["tcp://127.0.0.1:0"])).start()
    yield d
    d.stop()


def orders(c, rows):  # type: ignore[no-untyped-def]
    return [c.publish("orders", json.dumps(r), headers={"region": r["region"]}) for r in rows]


ROWS = [
    {"region": "eu", "qty": 5, "price": 10.0},
    {"region": "us", "qty": 1, "price": 99.0},
    {"region": "eu", "qty": 20, "price": 2.5},
    {"region": "ap", "qty": 7, "price": 3.0},
]


def test_a_filtered_subscription_over_the_wire_gets_only_matching_messages(dispatcher):
    with zq.connect(dispatcher.endpoint) as c:
        bms = orders(c, ROWS)
        with c.subscribe("orders", max_backlog=10, filter="region = 'eu' AND /qty > 1") as sub:
            got = [sub.get(5) for _ in range(2)]
            assert [m.bookmark for m in got] == [bms[0], bms[2]]
            assert sub.get(0.2) is None
            for m in got:
                m.ack()
        left = [m["bookmark"] for m in c.peek("orders")]
        assert left == [bms[1], bms[3]]


def test_a_bad_filter_gets_an_error_naming_the_position(dispatcher):
    with zq.connect(dispatcher.inproc) as c:
        with pytest.raises(ZqError, match="position 9"):
            c.subscribe("orders", filter="region = ")
        c.publish("orders", b"still serving")
        assert len(c.peek("orders")) == 1


def test_peek_with_a_filter_lists_matching_waiting_messages(dispatcher):
    with zq.connect(dispatcher.inproc) as c:
        bms = orders(c, ROWS)
        got = c.peek("orders", limit=10, filter="/price * /qty >= 50")
        assert [m["bookmark"] for m in got] == [bms[0], bms[1], bms[2]]
        assert [m["bookmark"] for m in c.peek("orders", limit=1, filter="region = 'ap'")] == [bms[3]]
        wait_until(lambda: c.stats()["queues"]["orders"]["depth"] == 4, what="nothing leased by peeking")
