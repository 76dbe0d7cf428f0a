"""Expired or failed work moves on: a redelivery prefers another consumer with credit,
and a late settle of a message dead-lettered since answers ``dead``."""

import pytest

from zq.core import QueueSettings
from zq.core import records as R
from zq.core.limits import DEAD_REMEMBERED

from .helpers import Harness


def jobs(**kw) -> QueueSettings:
    kw.setdefault("lease_ms", 1000)
    return QueueSettings(name="jobs", max_per_subscription_backlog=10, **kw)


@pytest.mark.parametrize("fairness", ["proportional", "round-robin", "fast"])
def test_an_expired_lease_goes_to_the_idle_worker_not_back_to_the_stuck_one(fairness):
    h = Harness(jobs(max_deliveries=3, fairness=fairness))
    [a] = h.pub("jobs")
    h.sub("A", "jobs", 1)  # subscribed first: every tie-break picks A
    h.sub("B", "jobs", 1)
    got = h.drain()
    stuck = next(iter(got))
    idle = "B" if stuck == "A" else "A"
    h.advance(1000)
    assert h.drain() == {idle: [a]}  # (before: the stuck one again, three times, then a dead letter)
    assert h.engine.settle("ack", idle, [a], [2], h.now) == {}


def test_a_failed_delivery_goes_to_someone_else_first():
    h = Harness(jobs())
    [a] = h.pub("jobs")
    h.sub("A", "jobs", 4)
    h.sub("B", "jobs", 1)
    got = h.drain()
    first = next(iter(got))
    other = "B" if first == "A" else "A"
    assert h.engine.settle("cancel", first, [a], [1], h.now, error="boom") == {}
    assert h.drain() == {other: [a]}


def test_a_plain_cancel_keeps_the_usual_choice():
    """Only an expiry or a failure says the holder may be stuck or broken."""
    h = Harness(jobs())
    [a] = h.pub("jobs")
    h.sub("A", "jobs", 1)
    h.sub("B", "jobs", 1)
    assert h.drain() == {"A": [a]}
    assert h.engine.settle("cancel", "A", [a], [1], h.now) == {}
    assert h.drain() == {"A": [a]}


def test_the_previous_holder_gets_it_again_when_nobody_else_has_credit():
    h = Harness(jobs())
    a, b = h.pub("jobs", 2)
    h.sub("A", "jobs", 1)
    h.sub("B", "jobs", 1)
    assert sorted(sum(h.drain().values(), [])) == [a, b]
    h.advance(999)
    holder_of_a = "A" if a in h.engine.queues["jobs"].lease_of and h.engine.queues["jobs"].lease_of[a].sub.sub_id == "A" else "B"
    other = "B" if holder_of_a == "A" else "A"
    h.engine.extend(other, [b], 60_000, h.now)  # the other one is busy with b for a long time
    h.advance(1)
    assert h.drain() == {holder_of_a: [a]}  # nobody else can take it: back to its holder, not left waiting


def test_grouped_messages_move_on_too():
    h = Harness(jobs(group_header="group"))
    [a] = h.pub("jobs", group="g1")
    h.sub("A", "jobs", 1)
    h.sub("B", "jobs", 1)
    got = h.drain()
    stuck = next(iter(got))
    idle = "B" if stuck == "A" else "A"
    h.advance(1000)
    assert h.drain() == {idle: [a]}


def test_a_filtered_queue_moves_on_to_a_matching_consumer_and_skips_a_refusing_one():
    h = Harness(jobs())
    [a] = h.pub("jobs", region="eu")
    h.sub("A", "jobs", 1)
    h.sub("C", "jobs", 1, filter="region = 'us'")  # has credit, refuses it
    h.sub("B", "jobs", 1, filter="region = 'eu'")
    assert h.drain() == {"A": [a]}
    h.advance(1000)
    assert h.drain() == {"B": [a]}


def test_a_set_aside_message_moves_on_too():
    """A message nobody with credit matched waits set aside; when a consumer with
    credit comes, the stuck holder does not take it back first."""
    h = Harness(jobs())
    [a] = h.pub("jobs", region="eu")
    h.sub("A", "jobs", 1, filter="region = 'eu'")
    h.sub("C", "jobs", 1, filter="region = 'us'")
    assert h.drain() == {"A": [a]}
    h.advance(1000)  # A's lease expires; C refuses it; A is the only taker: it goes back to A
    assert h.drain() == {"A": [a]}
    h.advance(1000)  # expired again: now B, matching, is there as well
    h.sub("B", "jobs", 1, filter="region = 'eu'")
    assert h.drain() == {"B": [a]}


def test_the_same_consumer_on_two_subscriptions_is_one_holder():
    h = Harness(jobs())
    [a] = h.pub("jobs")
    h.sub("A1", "jobs", 1, consumer="A")
    h.sub("A2", "jobs", 1, consumer="A")
    h.sub("B", "jobs", 1)
    assert h.drain() == {"A1": [a]}  # (ties go to the first subscribed)
    h.advance(1000)
    assert h.drain() == {"B": [a]}


def test_a_late_ack_of_a_dead_lettered_message_answers_dead():
    h = Harness(jobs(max_deliveries=1, dead_letter="jobs.dead"))
    [a] = h.pub("jobs")
    h.sub("A", "jobs", 1)
    h.drain()
    h.advance(1000)
    h.drain()
    assert [e.bookmarks for e in h.events(R.EXPIRED)] == [[a]]
    assert h.engine.settle("ack", "A", [a], [1], h.now) == {"dead": [a]}


def test_a_late_ack_after_a_plain_ack_still_answers_done():
    h = Harness(jobs())
    [a] = h.pub("jobs")
    h.sub("A", "jobs", 1)
    h.drain()
    assert h.engine.settle("ack", "A", [a], [1], h.now) == {}
    assert h.engine.settle("ack", "A", [a], [1], h.now) == {"done": [a]}


def test_a_message_dropped_without_a_dead_letter_queue_answers_dead_too():
    h = Harness(jobs(max_deliveries=1))
    [a] = h.pub("jobs")
    h.sub("A", "jobs", 1)
    h.drain()
    h.advance(1000)
    h.drain()
    assert h.engine.settle("cancel", "A", [a], [1], h.now) == {"dead": [a]}


def test_the_memory_of_dead_bookmarks_is_bounded():
    q = Harness(jobs()).engine.queues["jobs"]
    for seq in range(1, DEAD_REMEMBERED + 101):
        q.recently_dead.remember(seq)
    assert len(q.recently_dead.seqs) == len(q.recently_dead.order) == DEAD_REMEMBERED
    assert q.settle_result(1, 10**9) == "done" and q.settle_result(DEAD_REMEMBERED + 100, 10**9) == "dead"


def test_recovery_remembers_what_was_dead_lettered_after_its_recovery_point():
    """(Before the queue's recovery point nothing is read again: a late settle of a
    message dead-lettered that long ago answers ``done``, as documented.)"""
    from zq.journal.base import recover_engine
    from zq.journal.memory_journal import MemoryJournal

    journal = MemoryJournal()
    h = Harness(jobs(max_deliveries=1))
    a, b = h.pub("jobs", 2)
    h.sub("A", "jobs", 1)
    h.commit_to(journal)
    h.advance(1000)
    assert h.commit_to(journal) == {"A": [b]}  # b stays unfinished: the recovery point stays before a's expiry
    eng = recover_engine(journal, [jobs(max_deliveries=1)])
    assert eng.queues["jobs"].settle_result(a, eng.next_seq) == "dead"
