"""Claims (pull mode) in the engine: credit only while a claim is open."""

import pytest

from zq.core import QueueSettings
from zq.core import records as R
from zq.core.errors import ProtocolError

from .helpers import Harness


def test_a_claim_takes_up_to_its_limit_and_then_has_no_credit():
    h = Harness()
    seqs = h.pub("jobs", 5)
    h.engine.claim("c", "jobs", "me", 3, 10_000, h.now)
    assert h.drain() == {"c": seqs[:3]}
    h.engine.end_claim("c")
    h.engine.ack("c", seqs[:3], h.now)
    assert h.drain() == {}  # settling opened no credit
    h.engine.claim("c", "jobs", "me", 10, 10_000, h.now)
    assert h.drain() == {"c": seqs[3:]}


def test_an_open_claim_waits_for_messages_published_later():
    h = Harness()
    h.engine.claim("c", "jobs", "me", 2, 10_000, h.now)
    assert h.drain() == {}
    seq = h.pub("jobs")
    assert h.drain() == {"c": seq}


def test_a_claims_lease_is_its_own_and_expiry_returns_the_message():
    h = Harness(QueueSettings(name="jobs", lease_ms=60_000))
    seq = h.pub("jobs")
    h.engine.claim("c", "jobs", "me", 1, 500, h.now)
    h.drain()
    h.engine.end_claim("c")
    h.advance(501)
    h.drain()
    assert [e.bookmarks for e in h.events(R.LEASE_EXPIRED)] == [seq]
    h.sub("w", "jobs")
    assert h.drain() == {"w": seq}


def test_a_destructive_claim_removes_what_it_takes_in_the_same_step():
    h = Harness()
    seqs = h.pub("jobs", 3)
    h.engine.claim("c", "jobs", "me", 2, 1000, h.now, destructive=True)
    assert h.drain() == {"c": seqs[:2]}
    kinds = [(e.kind, e.bookmarks) for e in h.records if type(e) is R.Event]
    assert kinds[-2:] == [(R.LEASED, seqs[:2]), (R.ACKED, seqs[:2])]
    assert h.engine.queues["jobs"].depth == 1 and not h.engine.queues["jobs"].lease_of


def test_claims_take_a_filter_and_lease_extension_works_on_claimed_messages():
    h = Harness()
    blue = h.pub("jobs", color="blue")
    red = h.pub("jobs", color="red")
    h.engine.claim("c", "jobs", "me", 5, 1000, h.now, filter="color = 'red'")
    assert h.drain() == {"c": red}
    assert h.engine.extend("c", red, 5000, h.now) == []
    h.engine.end_claim("c")
    h.engine.claim("c", "jobs", "me", 5, 1000, h.now)
    assert h.drain() == {"c": blue}


def test_bad_claims_are_refused():
    h = Harness()
    with pytest.raises(ProtocolError):
        h.engine.claim("c", "jobs", "me", 0, 1000, h.now)
    h.sub("s", "jobs")
    with pytest.raises(ProtocolError, match="not a claim"):
        h.engine.claim("s", "jobs", "me", 1, 1000, h.now)
