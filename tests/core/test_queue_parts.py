"""The parts a ``Queue`` is made of (zq.core.queue), each on its own: ``LeaseClock``
(when each lease runs out), ``DelayTimer`` (messages that may not go before a time),
``CauseLedger`` (why deliveries ended unfinished, by cause)."""

from __future__ import annotations

from zq.core import QueueSettings
from zq.core.queue import DelayTimer, Lease, LeaseClock, Queue, Subscription

HOLDER = Subscription("s", Queue(QueueSettings(name="q")), "c", 1)


def lease(deadline_ms: int, live: int = 1) -> Lease:
    x = Lease(HOLDER, deadline_ms)
    x.live = live
    return x


def due(clock: LeaseClock, now_ms: int) -> list[Lease]:
    out = []
    while (x := clock.pop_due(now_ms)) is not None:
        out.append(x)
    return out


def test_leases_of_the_period_run_out_in_order_and_only_when_due():
    clock = LeaseClock()
    a, b, c = lease(100), lease(200), lease(300)
    for x in (a, b, c):
        clock.add_in_order(x)
    assert clock.next_ms() == 100
    assert due(clock, 99) == []
    assert due(clock, 200) == [a, b]
    assert clock.next_ms() == 300


def test_other_deadlines_wait_by_deadline_and_ties_keep_their_order():
    clock = LeaseClock()
    late, early, tie1, tie2 = lease(500), lease(50), lease(70), lease(70)
    for x in (late, early, tie1, tie2):
        clock.add(x)
    assert clock.next_ms() == 50
    assert due(clock, 70) == [early, tie1, tie2]
    assert clock.next_ms() == 500


def test_settled_leases_are_dropped_not_waited_for():
    clock = LeaseClock()
    settled, live = lease(100, live=0), lease(400)
    clock.add_in_order(settled)
    clock.add_in_order(live)
    assert clock.next_ms() == 400  # the settled one is not a deadline
    held = lease(1_000, live=0)
    clock.add(held)
    assert due(clock, 0) == [held]  # settled: taken off at once, whatever its deadline


def test_those_in_order_come_before_the_heap_when_both_are_due():
    clock = LeaseClock()
    ordered, own = lease(100), lease(10)
    clock.add_in_order(ordered)
    clock.add(own)
    assert clock.next_ms() == 10
    assert due(clock, 100) == [ordered, own]


def test_a_new_period_moves_the_old_leases_that_still_hold_something_by_deadline():
    clock = LeaseClock()
    old, settled = lease(1_000), lease(900, live=0)
    clock.add_in_order(settled)
    clock.add_in_order(old)
    clock.period_changed()
    new = lease(200)  # a shorter period: it ends before the old one
    clock.add_in_order(new)
    assert clock.next_ms() == 200
    assert due(clock, 1_000) == [new, old]
    assert clock.next_ms() is None


def test_delays_come_due_in_time_order_with_their_group():
    timer = DelayTimer()
    timer.mark(7, 0, 300)
    timer.mark(5, 2, 100)
    timer.mark(9, 0, 100)
    assert timer.next_ms() == 100 and not timer.any_due(99) and timer.any_due(100)
    assert timer.take_due(100) == [(5, 2), (9, 0)]
    assert timer.due == {7: (300, 0)}
    assert timer.take_due(299) == [] and timer.take_due(300) == [(7, 0)]
    assert timer.next_ms() is None


def test_a_mark_removed_or_set_again_leaves_a_stale_timer_that_wakes_nothing():
    timer = DelayTimer()
    timer.mark(1, 0, 100)
    timer.mark(2, 0, 100)
    del timer.due[1]  # settled or removed while it waited
    timer.mark(2, 0, 500)  # delayed again
    assert timer.next_ms() == 100  # stale, and cheap to wake for
    assert timer.take_due(100) == []
    assert timer.take_due(500) == [(2, 0)]


def test_the_ledger_counts_each_cause_and_says_when_a_limit_is_reached():
    from zq.core import records as R
    from zq.core.queue import CauseLedger

    ledger = CauseLedger(QueueSettings(name="q", max_failures=2, max_lease_expiries=1))
    ledger.names["c1"] = "worker one"
    assert ledger.limited()
    assert ledger.note(5, R.CANCELLED, "c1", 10) == ""  # a cancel without an error counts, and limits nothing
    assert ledger.note(5, R.CANCELLED, "c1", 20, error="boom") == ""
    assert ledger.note(5, R.CANCELLED, "c2", 30, error="again") == R.REASON_MAX_FAILURES
    c = ledger.open[5]
    assert (c.cancelled, c.failed, c.last_error, c.last_consumer, c.first_ms, c.last_ms) == (1, 2, "again", "c2", 10, 30)
    assert ledger.note(6, R.LEASE_EXPIRED, "c1", 40) == R.REASON_MAX_LEASE_EXPIRIES
    assert ledger.open[6].last_consumer == "worker one"  # named as it named itself
    assert ledger.note(7, R.RETURNED, "c1", 50) == ""  # its holder gone: no limit on that cause here
    assert (ledger.failed, ledger.lease_expiries, ledger.consumers_gone) == (2, 1, 1)
    ledger.finished(5)
    assert 5 not in ledger.open and ledger.done[5] is c  # its dead letter carries it
    ledger.configure(QueueSettings(name="q"))
    assert not ledger.limited()
    ledger.restore(9, [1, 2, 3, 4, 100, 200], "why", "who")
    r = ledger.open[9]
    assert (r.cancelled, r.failed, r.lease_expired, r.consumer_gone, r.first_ms, r.last_ms, r.last_error,
            r.last_consumer) == (1, 2, 3, 4, 100, 200, "why", "who")
