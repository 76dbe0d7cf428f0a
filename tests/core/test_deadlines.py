"""Message deadlines (a publish's ttl / expires_at; zq.core.deadlines): a message still
waiting at its deadline expires with reason ``ttl`` and is dead-lettered; one out with a
consumer is not cut short, but does not go again after its deadline; restarts keep them."""

import pytest

from zq.core import QueueSettings
from zq.core import records as R
from zq.core.deadlines import HEADER, deadline_of
from zq.core.errors import ProtocolError
from zq.journal.base import recover_engine
from zq.journal.memory_journal import MemoryJournal

from .helpers import Harness


def queue(**kw) -> QueueSettings:
    kw.setdefault("backoff_ms", [])
    kw.setdefault("dead_letter", "jobs.dead")
    return QueueSettings(name="jobs", lease_ms=10_000, max_per_subscription_backlog=10, **kw)


def expired(h: Harness) -> dict[int, str]:
    return {seq: ev.reason for ev in h.events(R.EXPIRED) for seq in ev.bookmarks}


def dead_letters(h: Harness) -> list[dict[str, str]]:
    """The dead letters' headers as a journal resolves them (the original's, and zq's)."""
    return [R.resolve_copy(r, h.journaled[r.copy_of]).headers for r in h.records
            if type(r) is R.Message and r.topic == "jobs.dead"]


def test_a_message_still_waiting_at_its_deadline_expires_with_reason_ttl_and_is_dead_lettered():
    h = Harness(queue())
    h.now = 1_000
    a = h.engine.publish("jobs", b"a", {}, h.now, deadline_ms=1_500)
    b = h.engine.publish("jobs", b"b", {}, h.now)
    h.drain()
    h.advance(499)
    h.drain()
    assert expired(h) == {}
    h.advance(1)
    h.drain()
    assert expired(h) == {a: "ttl"}
    [letter] = dead_letters(h)
    assert letter["zq.reason"] == "ttl" and letter["zq.bookmark"] == str(a) and HEADER not in letter
    assert h.engine.stats()["queues"]["jobs"]["ttl_expired"] == 1
    h.sub("w", "jobs", 5)
    assert h.drain() == {"w": [b]}  # b had no deadline


def test_an_acked_message_leaves_nothing_behind_and_no_deadline_fires():
    h = Harness(queue())
    seqs = [h.engine.publish("jobs", b"x", {}, h.now, deadline_ms=100) for _ in range(3)]
    h.sub("w", "jobs", 5)
    assert h.drain() == {"w": seqs}
    h.engine.ack("w", seqs, h.now)
    h.drain()
    q = h.engine.queues["jobs"]
    assert q.deadlines.due == {} and q.deadlines.overdue == set()
    h.advance(1_000)
    h.drain()
    assert expired(h) == {}


def test_a_delivery_out_at_the_deadline_runs_and_does_not_go_again_after_it():
    h = Harness(queue())
    a, b = (h.engine.publish("jobs", b"x", {}, h.now, deadline_ms=100) for _ in range(2))
    h.sub("w", "jobs", 5)
    assert h.drain() == {"w": [a, b]}
    h.advance(200)
    h.drain()
    assert expired(h) == {}  # both out with w: not cut short
    h.engine.ack("w", [a], h.now)  # still acked after the deadline
    h.engine.cancel("w", [b], h.now)
    h.drain()
    assert expired(h) == {b: "ttl"}  # came back after its deadline: it expires instead of going again


def test_the_sooner_of_expiration_and_the_deadline_wins():
    h = Harness(queue(expiration_ms=300))
    a = h.engine.publish("jobs", b"x", {}, h.now, deadline_ms=10_000)
    b = h.engine.publish("jobs", b"x", {}, h.now, deadline_ms=100)
    h.drain()
    h.advance(100)
    h.drain()
    h.advance(200)
    h.drain()
    assert expired(h) == {b: "ttl", a: "expired"}


def test_a_group_goes_on_when_its_waiting_head_expires():
    h = Harness(queue(group_policy="sequenced"))
    a = h.engine.publish("jobs", b"x", {"group": "g"}, h.now, deadline_ms=100)
    b = h.engine.publish("jobs", b"x", {"group": "g"}, h.now)
    h.drain()
    h.advance(100)
    h.drain()
    h.sub("w", "jobs", 5)
    assert h.drain() == {"w": [b]} and expired(h) == {a: "ttl"}


def test_a_restart_keeps_each_deadline_and_one_that_passed_meanwhile_fires_at_once():
    settings = queue()
    j = MemoryJournal()
    h = Harness(settings)
    h.now = 10_000
    a = h.engine.publish("jobs", b"a", {}, h.now, deadline_ms=10_500)
    b = h.engine.publish("jobs", b"b", {}, h.now, deadline_ms=20_000)
    h.commit_to(j)
    h2 = Harness(settings)
    h2.engine = recover_engine(j, [settings])
    h2.journaled.update(h.journaled)
    h2.now = 11_000
    h2.engine.advance(h2.now)
    h2.drain()
    assert expired(h2) == {a: "ttl"}
    assert h2.engine.queues["jobs"].deadlines.due == {b: 20_000}
    h2.advance(9_000)
    h2.drain()
    assert expired(h2) == {a: "ttl", b: "ttl"}


def test_a_queue_whose_messages_have_no_deadline_keeps_nothing_for_them():
    h = Harness(queue())
    h.pub("jobs", 100)
    h.drain()
    q = h.engine.queues["jobs"]
    assert q.deadlines.due == {} and q.deadlines.heap == [] and q.next_deadline_ms() is None


def test_finished_messages_do_not_pile_up_in_the_heap():
    h = Harness(queue())
    h.sub("w", "jobs", 10)
    for _ in range(600):
        seqs = [h.engine.publish("jobs", b"x", {}, h.now, deadline_ms=10**9) for _ in range(10)]
        assert h.drain() == {"w": seqs}
        h.engine.ack("w", seqs, h.now)
    q = h.engine.queues["jobs"]
    assert q.deadlines.due == {} and len(q.deadlines.heap) <= 2_100  # compacted, not 6,000


@pytest.mark.parametrize("deadline", [-1, 10**15])
def test_a_deadline_out_of_range_is_refused_and_nothing_is_published(deadline):
    h = Harness(queue())
    with pytest.raises(ProtocolError, match="deadline"):
        h.engine.publish("jobs", b"x", {}, h.now, deadline_ms=deadline)
    assert h.drain() == {} and h.engine.next_seq == 1


def test_a_client_cannot_send_the_deadline_header_itself_and_a_bad_one_is_no_deadline():
    h = Harness(queue())
    with pytest.raises(ProtocolError, match="reserved"):
        h.engine.publish("jobs", b"x", {HEADER: "5"}, h.now)
    assert deadline_of({HEADER: "soon"}) == 0 and deadline_of({HEADER: "-5"}) == 0 and deadline_of({}) == 0


def test_expiring_many_messages_of_an_ordered_queue_does_not_search_for_each(monkeypatch):
    """A deadline's message is known to wait (not leased, not removed): an ordered queue's
    heap is not scanned once per expiring message (4,096 at once froze a big queue)."""
    from zq.core import removal

    h = Harness(queue(priority="/p"))
    h.pub("jobs", 200)  # no deadline: the heap is big
    doomed = h.engine.publish_many("jobs", [(b'{"p": 1}', {}, None)] * 50, h.now, deadline_ms=100)
    h.drain()
    searched = []
    original = removal.is_waiting
    monkeypatch.setattr(removal, "is_waiting", lambda q, seq: searched.append(seq) or original(q, seq))
    h.advance(100)
    h.drain()
    assert set(expired(h)) == set(doomed) and searched == []


def test_an_ack_after_the_deadline_leaves_nothing_behind():
    h = Harness(queue())
    seqs = h.engine.publish_many("jobs", [(b"x", {}, None)] * 3, h.now, deadline_ms=100)
    h.sub("w", "jobs", 5)
    assert h.drain() == {"w": seqs}
    h.advance(200)  # out with w at their deadline: overdue
    h.drain()
    q = h.engine.queues["jobs"]
    assert q.deadlines.overdue == set(seqs)
    h.engine.ack("w", seqs, h.now)  # the batch path
    h.drain()
    assert q.deadlines.overdue == set() and q.deadlines.due == {} and expired(h) == {}


def test_purged_and_replaced_messages_drop_their_deadline_at_once():
    h = Harness(queue(), QueueSettings(name="latest", lvq_key="k", backoff_ms=[]))
    h.engine.publish_many("jobs", [(b"x", {}, None)] * 5, h.now, deadline_ms=10**9)
    for v in (b"1", b"2", b"3"):
        h.engine.publish("latest", v, {"k": "a"}, h.now, deadline_ms=10**9)
    h.drain()
    assert h.engine.stats()["queues"]["latest"]["with_deadline"] == 1  # the two replaced ones left it
    h.engine.purge("jobs", h.now)
    h.drain()
    assert h.engine.stats()["queues"]["jobs"]["with_deadline"] == 0
