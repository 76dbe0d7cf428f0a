"""browse_only queues: every subscriber sees every message; none leaves by acks."""

from zq.core import QueueSettings

from .helpers import Harness


def test_every_browser_sees_every_message_in_order_and_acks_only_return_credit():
    h = Harness(QueueSettings(name="feed", browse_only=True, expiration_ms=1000))
    seqs = h.pub("feed", 5)
    h.sub("a", "feed", backlog=10)
    h.sub("b", "feed", backlog=2)
    got = h.drain()
    assert got == {"a": seqs, "b": seqs[:2]}
    h.engine.ack("b", seqs[:2], h.now)
    assert h.drain() == {"b": seqs[2:4]}
    h.engine.ack("a", seqs, h.now)
    assert h.engine.queues["feed"].depth == 5  # acks remove nothing
    late = h.pub("feed")
    h.sub("c", "feed", backlog=10)
    assert h.drain() == {"a": late, "c": seqs + late}
    h.advance(1001)  # messages leave by expiration only
    h.drain()
    assert h.engine.queues["feed"].depth == 0


def test_a_browse_only_last_value_queue_shows_the_latest_value_per_key():
    h = Harness(QueueSettings(name="state", browse_only=True, lvq_key="k"))
    h.pub("state", k="x", payload=b"1")
    h.pub("state", k="y", payload=b"1")
    newest = h.pub("state", k="x", payload=b"2")
    h.sub("a", "state", backlog=10, filter="k = 'x'")
    assert h.drain() == {"a": newest}
