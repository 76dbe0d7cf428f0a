"""Session-wide lease renewal: a connected holder's leases renew up to max_lease_age."""

import pytest

from zq.core import QueueSettings
from zq.core import records as R
from zq.core.errors import ConfigError

from .helpers import Harness


def queue(**kw) -> QueueSettings:
    return QueueSettings(name="jobs", lease_ms=100, max_lease_age_ms=1000, max_per_subscription_backlog=10, **kw)


def test_a_connected_holder_keeps_its_lease_until_the_maximum_age_then_it_times_out():
    h = Harness(queue())
    [a] = h.pub("jobs")
    h.sub("w", "jobs", 1)
    h.sub("v", "jobs", 1)
    got = h.drain()
    holder = next(iter(got))
    for _ in range(9):  # 900 ms: nine lease periods, no extend called
        h.advance(100)
        assert h.drain() == {}
        assert not h.events(R.LEASE_EXPIRED)
    h.advance(100)  # 1,000 ms after delivery: a stuck holder times out
    got = h.drain()
    assert [e.bookmarks for e in h.events(R.LEASE_EXPIRED)] == [[a]]
    assert sum(got.values(), []) == [a]
    assert h.engine.stats()["queues"]["jobs"]["renewed"] == 9
    assert h.engine.settle("ack", holder, [a], [1], h.now) == {"lost": [a]}  # the stuck one's late ack


def test_the_holder_leaving_ends_its_leases_at_once():
    h = Harness(queue())
    [a] = h.pub("jobs")
    h.sub("w", "jobs", 1)
    assert h.drain() == {"w": [a]}
    h.advance(350)
    h.engine.disconnect("w", h.now)  # its heartbeats stopped: the adapter dropped it
    h.sub("v", "jobs", 1)
    assert h.drain() == {"v": [a]}


def test_an_extend_is_capped_at_the_maximum_age_too():
    h = Harness(queue())
    [a] = h.pub("jobs")
    h.sub("w", "jobs", 1)
    h.drain()
    h.advance(200)
    assert h.engine.extend("w", [a], 60_000, h.now) == []
    lease = h.engine.queues["jobs"].lease_of[a]
    assert (lease.started_ms, lease.deadline_ms) == (0, 1000)


def test_extends_keep_each_delivery_its_own_age():
    h = Harness(queue())
    [a] = h.pub("jobs")
    h.sub("w", "jobs", 2)
    h.drain()
    h.advance(500)
    [b] = h.pub("jobs")
    h.drain()
    h.advance(50)
    h.engine.extend("w", [a, b], 10_000, h.now)
    q = h.engine.queues["jobs"]
    assert (q.lease_of[a].deadline_ms, q.lease_of[b].deadline_ms) == (1000, 1500)


def test_a_claim_is_renewed_and_capped_like_a_subscription():
    h = Harness(queue())
    [a] = h.pub("jobs")
    h.engine.claim("c", "jobs", "c", 1, 60_000, h.now)
    assert h.drain() == {"c": [a]}
    assert h.engine.queues["jobs"].lease_of[a].deadline_ms == 1000


def test_max_lease_age_is_checked():
    for bad, says in (({"max_lease_age_ms": 50}, "shorter than the lease"), ({"max_lease_age_ms": -1}, "negative"),
                      ({"max_lease_age_ms": 10**20}, "100 years"),
                      ({"max_lease_age_ms": 1000, "semantics": "at-most-once", "fairness": "round-robin"}, "at-most-once")):
        with pytest.raises(ConfigError, match=says):
            QueueSettings(name="q", lease_ms=100, **bad).validate()
