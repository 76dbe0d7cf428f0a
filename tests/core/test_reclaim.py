"""Reclaiming unstarted work: a reclaimable subscription's deliveries it has not started
are asked back (REVOKE) for a hungry subscription and, given back (RELEASE), go again
with no delivery counted."""

import pytest

from zq.core import QueueSettings, limits
from zq.core import records as R
from zq.core.errors import ProtocolError
from zq.core.explain import explain
from zq.journal.base import recover_engine
from zq.journal.memory_journal import MemoryJournal

from .helpers import Harness


def queue(**kw) -> QueueSettings:
    kw.setdefault("lease_ms", 60_000)
    kw.setdefault("max_per_subscription_backlog", 64)
    return QueueSettings(name="jobs", **kw)


def reclaimable(h: Harness, sub_id: str, backlog: int, filter: str | None = None) -> None:
    h.engine.subscribe(sub_id, "jobs", sub_id, backlog, h.now, filter=filter, reclaimable=True)


def revoked(h: Harness) -> dict[str, tuple[list[int], list[int]]]:
    return {r.sub_id: (r.seqs, r.epochs) for r in h.revokes}


def holder_then_hungry(h: Harness, held: int, hungry_backlog: int) -> list[int]:
    """Reclaimable "a" takes ``held`` messages, then "b" subscribes with nothing to take."""
    reclaimable(h, "a", held)
    seqs = h.pub("jobs", held)
    h.drain()
    h.sub("b", "jobs", hungry_backlog)
    h.drain()
    return seqs


def give_back(h: Harness, sub_id: str, kept: tuple[int, ...] = ()) -> dict[str, list[int]]:
    """The holder answers its revoke: everything not in ``kept`` was not started."""
    seqs, epochs = revoked(h)[sub_id]
    back = [(s, e) for s, e in zip(seqs, epochs) if s not in kept]
    kept_epochs = [e for s, e in zip(seqs, epochs) if s in kept]
    h.engine.release_revoked(sub_id, [s for s, _ in back], [e for _, e in back], list(kept), kept_epochs, h.now)
    return h.drain()


def test_a_hungry_subscriber_gets_the_newer_half_of_a_full_holders_unstarted_work():
    h = Harness(queue())
    reclaimable(h, "a", 8)
    seqs = h.pub("jobs", 8)
    assert h.drain() == {"a": seqs}
    assert h.revokes == []  # no one is hungry
    h.sub("b", "jobs", 8)
    assert h.drain() == {}
    assert revoked(h) == {"a": (seqs[:3:-1], [1, 1, 1, 1])}  # newest first; the older half stays
    got = give_back(h, "a")
    assert got == {"b": seqs[4:]}
    [ev] = h.events(R.RECLAIMED)
    assert (ev.consumer, sorted(ev.bookmarks), ev.deliveries) == ("a", seqs[4:], [1, 1, 1, 1])
    q = h.engine.queues["jobs"]
    assert [q.deliveries_of(s) for s in seqs[4:]] == [2] * 4  # the epoch moves on: the fence tells them apart
    assert [q.counted_deliveries(s, q.meta[s]) for s in seqs[4:]] == [1] * 4  # ... the limits do not count it
    stats = h.engine.stats()["queues"]["jobs"]
    assert (stats["revoked"], stats["reclaimed"], stats["delivered"]) == (4, 4, 12)
    assert [(c["sub"], c["used"], c["reclaimable"]) for c in stats["consumers"]] == [("a", 4, True), ("b", 4, False)]


def test_given_back_work_goes_to_the_others_first_even_when_the_holder_would_be_chosen():
    """``fast`` fairness picks the first subscription with credit: without the hold the
    holder would take its messages straight back."""
    h = Harness(queue(fairness="fast"))
    seqs = holder_then_hungry(h, 4, 2)
    assert revoked(h) == {"a": ([seqs[3], seqs[2]], [1, 1])}
    assert give_back(h, "a") == {"b": [seqs[2], seqs[3]]}
    q = h.engine.queues["jobs"]
    assert [(s.used, s.backlog) for s in q.subs] == [(2, 4), (2, 2)]  # the holder's credit is back after


def test_only_as_much_as_the_hungry_can_take_is_asked_back():
    h = Harness(queue())
    seqs = holder_then_hungry(h, 8, 1)
    assert revoked(h) == {"a": ([seqs[7]], [1])}


def test_started_work_is_kept_and_not_asked_for_again():
    h = Harness(queue())
    seqs = holder_then_hungry(h, 8, 8)
    asked, epochs = revoked(h)["a"]
    h.engine.release_revoked("a", [], [], asked, epochs, h.now)  # all started
    assert h.drain() == {}
    # the next decision asks for the newer half of what it may still take back
    assert revoked(h) == {"a": (seqs[3:1:-1], [1, 1])}
    give_back(h, "a")
    assert h.engine.subs["b"].used == 2


def test_no_second_revoke_while_one_is_unanswered():
    h = Harness(queue())
    reclaimable(h, "a", 16)
    h.pub("jobs", 16)
    h.drain()
    h.sub("b", "jobs", 16)
    h.drain()
    assert len(revoked(h)["a"][0]) == 8
    for _ in range(3):
        h.advance(5)
        h.pub("other", 1)  # counters move; the queue is looked at again
        h.drain()
        assert h.revokes == []


def test_only_reclaimable_subscriptions_are_asked():
    h = Harness(queue())
    h.sub("a", "jobs", 8)
    h.pub("jobs", 8)
    h.drain()
    h.sub("b", "jobs", 8)
    h.drain()
    assert h.revokes == []
    with pytest.raises(ProtocolError, match="not reclaimable"):
        h.engine.release_revoked("a", [1], [1], [], [], h.now)


def test_a_release_takes_back_only_what_was_asked_for_and_is_still_that_delivery():
    h = Harness(queue())
    reclaimable(h, "a", 8)
    seqs = h.pub("jobs", 8)
    h.drain()
    # Not asked for: a client cannot hand work back uncounted on its own.
    assert h.engine.release_revoked("a", seqs[:2], [1, 1], [], [], h.now) == 0
    h.sub("b", "jobs", 8)
    h.drain()
    asked, epochs = revoked(h)["a"]
    # A wrong epoch (an older or newer delivery) and unknown bookmarks are ignored.
    assert h.engine.release_revoked("a", [asked[0], 2**63, -1], [epochs[0] + 1, 1, 1], [2**63], [1], h.now) == 0
    assert h.engine.release_revoked("a", asked[1:], epochs[1:], [], [], h.now) == 3
    # Answered already: a second release of the same deliveries does nothing.
    assert h.engine.release_revoked("a", asked[1:], epochs[1:], [], [], h.now) == 0
    assert sorted(h.drain()["b"]) == sorted(asked[1:])
    with pytest.raises(ProtocolError, match="epochs"):
        h.engine.release_revoked("a", [1, 2], [1], [], [], h.now)
    with pytest.raises(ProtocolError, match="epochs"):
        h.engine.release_revoked("a", [], [], [1], [], h.now)


def test_a_late_settle_of_a_given_back_delivery_is_lost():
    h = Harness(queue())
    seqs = holder_then_hungry(h, 4, 1)
    assert give_back(h, "a") == {"b": [seqs[3]]}  # delivery 2
    assert h.engine.settle("ack", "a", [seqs[3]], [1], h.now) == {"lost": [seqs[3]]}  # at b now
    h.engine.unsubscribe("b", h.now)
    assert h.drain() == {"a": [seqs[3]]}  # delivery 3, back at a
    assert h.engine.settle("ack", "a", [seqs[3]], [1], h.now) == {"lost": [seqs[3]]}  # not the given-back one
    assert h.engine.settle("ack", "a", [seqs[3]], [3], h.now) == {}  # its live delivery


def test_reclaimed_deliveries_do_not_count_against_max_deliveries():
    h = Harness(queue(max_deliveries=2, dead_letter="jobs.dead"))
    reclaimable(h, "a", 2)
    a1, a2 = h.pub("jobs", 2)
    h.drain()
    h.sub("b", "jobs", 1)
    h.drain()
    assert revoked(h) == {"a": ([a2], [1])}
    assert give_back(h, "a") == {"b": [a2]}
    h.engine.cancel("b", [a2], h.now, delay_ms=0)  # its second delivery, its first counted one, failed
    got = h.drain()
    assert got == {"b": [a2]}  # it goes again: one counted delivery of two
    h.engine.cancel("b", [a2], h.now, delay_ms=0)  # the second counted one fails: the limit
    h.drain()
    [dead] = [r for r in h.records if type(r) is R.Message and r.copy_of == a2]
    assert dead.headers["zq.reason"] == R.REASON_MAX_DELIVERIES
    assert (dead.headers["zq.deliveries"], dead.headers["zq.reclaimed"]) == ("3", "1")


def test_grouped_messages_are_never_asked_back():
    h = Harness(queue(group_policy="exclusive"))
    reclaimable(h, "a", 8)
    grouped = h.pub("jobs", 4, group="g")
    free = h.pub("jobs", 4)
    h.drain()
    h.sub("b", "jobs", 8)
    h.drain()
    asked = revoked(h)["a"][0]
    assert asked == [free[3], free[2]] and not set(asked) & set(grouped)


def test_only_what_a_hungry_filtered_subscriber_would_take_is_asked_back():
    h = Harness(queue())
    reclaimable(h, "a", 8)
    reds = [h.pub("jobs", color="red")[0] for _ in range(4)]
    blues = [h.pub("jobs", color="blue")[0] for _ in range(4)]
    h.drain()
    h.sub("b", "jobs", 8, filter="color = 'blue'")
    h.drain()
    asked = revoked(h)["a"][0]
    assert asked == [blues[3], blues[2]] and not set(asked) & set(reds)
    assert give_back(h, "a") == {"b": [blues[2], blues[3]]}


def test_a_message_is_taken_back_a_bounded_number_of_times():
    """A holder keeps getting the same message back (each hungry newcomer takes it, then
    leaves): it is taken back at most RECLAIMS_PER_MESSAGE_MAX times, then stays."""
    h = Harness(queue())
    reclaimable(h, "a", 3)
    m1, m2, m3 = h.pub("jobs", 3)
    h.drain()
    for i in range(limits.RECLAIMS_PER_MESSAGE_MAX):
        h.sub(f"s{i}", "jobs", 1)
        h.drain()
        assert revoked(h) == {"a": ([m3], [1 + 2 * i])}
        assert give_back(h, "a") == {f"s{i}": [m3]}
        h.engine.unsubscribe(f"s{i}", h.now)
        assert h.drain() == {"a": [m3]}
    q = h.engine.queues["jobs"]
    assert q.reclaiming.given[m3] == limits.RECLAIMS_PER_MESSAGE_MAX
    assert q.counted_deliveries(m3, q.meta[m3]) == 1 + limits.RECLAIMS_PER_MESSAGE_MAX  # the newcomers' count
    h.sub("last", "jobs", 1)
    h.drain()
    assert revoked(h) == {"a": ([m2], [1])}  # not m3 again


def test_recovery_keeps_the_account_of_reclaims_and_counts_no_consumer_gone_for_them():
    settings = queue(max_deliveries=2, dead_letter="jobs.dead")
    j = MemoryJournal()
    h = Harness(settings)
    reclaimable(h, "a", 2)
    a1, a2 = h.pub("jobs", 2)
    h.commit_to(j)
    h.sub("b", "jobs", 1)
    h.commit_to(j)
    h.engine.release_revoked("a", *revoked(h)["a"], [], [], h.now)
    h.commit_to(j)  # a2 leased to b (delivery 2)
    engine = recover_engine(j, [settings])  # the dispatcher died with a1 at a and a2 at b
    q = engine.queues["jobs"]
    assert q.reclaiming.given == {a2: 1}
    c = q.causes_of(a2)
    assert (c.consumer_gone, c.cancelled) == (1, 0)  # the crash cut delivery 2; delivery 1 was given back
    assert q.counted_deliveries(a2, q.meta[a2]) == 1
    doc = explain(engine, "jobs", a2, h.now, "jobs", {})
    assert doc["reclaimed"] == 1 and doc["deliveries"] == 2


@pytest.mark.parametrize("kind", [{"semantics": "at-most-once"}, {"browse_only": True}])
def test_reclaimable_needs_an_at_least_once_queue_that_leases(kind):
    h = Harness(queue(**kind))
    with pytest.raises(ProtocolError, match="reclaimable needs an at-least-once queue"):
        reclaimable(h, "a", 4)
    assert "a" not in h.engine.subs


def test_a_holder_that_leaves_with_a_revoke_unanswered_returns_everything_as_before():
    h = Harness(queue())
    seqs = holder_then_hungry(h, 8, 4)
    assert h.revokes
    h.engine.disconnect("a", h.now)
    got = h.drain()
    assert sorted(got["b"]) == seqs[:4]
    assert h.engine.queues["jobs"].reclaiming.reclaimed == 0


def test_explain_says_a_delivery_was_asked_back():
    h = Harness(queue())
    seqs = holder_then_hungry(h, 4, 4)
    doc = explain(h.engine, "jobs", seqs[3], h.now, "jobs", {})
    assert any("asked back" in w for w in doc["why"])
    assert not any("asked back" in w for w in explain(h.engine, "jobs", seqs[0], h.now, "jobs", {})["why"])


def test_an_answer_about_an_older_delivery_is_not_taken_for_the_newer_one():
    """Found by the simulator: a revoke's delivery expired unanswered, the message came
    back to the same holder, and was asked back again; the late "kept" for the old
    delivery must not settle the new revoke (the holder gives the new one back)."""
    h = Harness(queue(lease_ms=100))
    reclaimable(h, "a", 2)
    m1, m2 = h.pub("jobs", 2)
    h.drain()
    h.sub("b2", "jobs", 1)
    h.drain()
    assert revoked(h) == {"a": ([m2], [1])}
    h.advance(100)  # a's leases end unanswered; both come back
    h.engine.unsubscribe("b2", h.now)
    assert sorted(h.drain()["a"]) == [m1, m2]  # deliveries 2
    h.sub("b3", "jobs", 1)
    h.drain()
    assert revoked(h) == {"a": ([m2], [2])}
    h.engine.release_revoked("a", [], [], [m2], [1], h.now)  # started: the old delivery (late)
    assert h.engine.release_revoked("a", [m2], [2], [], [], h.now) == 1  # the new one comes back
    assert h.drain() == {"b3": [m2]}
