"""The parts a ``Queue`` is made of, each on its own through a real queue (no engine, no
journal, no clock): when leases run out and what a delivery's count means
(``zq.core.leases``), delays (``delaying``), the accounting by cause (``causes``), the
set-aside list (``aside``), the choice of subscription (``choosing``), expiry
(``expiry``), browsing (``browse``), the views of where messages wait (``inventory``),
groups (``grouping``), settles and fences (``settling``), removal (``removal``),
entering and ranking (``entering``), target depth (``depth``), last values and size
limits (``overflow``) and barriers (``barriers``). docs/architecture.md, "A queue's
parts", says what each owns."""

from __future__ import annotations

from array import array

from zq.core import QueueSettings, browse, choosing, delaying, entering, expiry, grouping, inventory, leases, limits, removal, settling
from zq.core.delaying import DelayTimer
from zq.core.leases import Lease, LeaseClock
from zq.core.queue import Queue, Subscription

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
    from zq.core.causes import CauseLedger

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


# ---------------------------------------------------------------- the parts in modules
# Each drives a real Queue through its own part: no engine, no journal, no clock.


def queue(**settings) -> Queue:
    return Queue(QueueSettings(name="q", lease_ms=1_000, **settings))


def subscribe(q: Queue, name: str, backlog: int, match=None) -> Subscription:
    sub = Subscription(name, q, name, backlog, match=match)
    q.add_subscription(sub)
    return sub


def taken(sub: Subscription) -> list[int]:
    return q_take(sub)[0]


def q_take(sub: Subscription) -> tuple[list[int], list[int]]:
    return sub.queue.take_outbox(sub)


def test_a_message_nobody_matches_is_set_aside_and_goes_to_the_first_taker():
    q = queue()
    odd = subscribe(q, "odd", 10, match=lambda seq: seq % 2 == 1)
    for seq in (1, 2, 3, 4):
        entering.enqueue(q, seq, 0)
    q.dispatch(0)
    assert taken(odd) == [1, 3]
    assert q.aside.live() == [2, 4] and q.aside.oldest() == 2
    assert inventory.waiting_set(q) == {2, 4}
    even = subscribe(q, "even", 10, match=lambda seq: seq % 2 == 0)
    q.dispatch(0)
    assert taken(even) == [2, 4]
    assert q.aside.live() == [] and q.aside.keys == array("Q")  # all gone: compacted away


def test_a_set_aside_group_head_holds_its_group_until_it_is_taken_out():
    q = queue()
    picky = subscribe(q, "picky", 10, match=lambda seq: seq != 1)
    gid = q.group_id("g")
    for seq in (1, 2):
        entering.enqueue(q, seq, gid)
    q.dispatch(0)
    assert taken(picky) == [] and q.groups[gid].held == 1  # 2 waits behind its group's head
    assert q.remove_available(1)  # an operator purge of the head
    assert q.groups[gid].held == 0
    q.dispatch(0)
    assert taken(picky) == [2]


def test_proportional_round_robin_and_fast_choose_as_their_names_say():
    # proportional: a tie goes to the first found, then the largest unused share (b: 3/4 > a: 1/2)
    for fairness, expected in (("proportional", ["a", "b", "b"]), ("round-robin", ["a", "b", "a"]),
                               ("fast", ["a", "a", "b"])):
        q = queue(fairness=fairness)
        a, b = subscribe(q, "a", 2), subscribe(q, "b", 4)
        got = []
        for _ in range(3):
            sub = choosing.choose(q, None)
            sub.used += 1
            got.append(sub.sub_id)
        assert got == expected, fairness


def test_the_holder_a_delivery_failed_with_is_passed_over_while_another_has_credit():
    q = queue()
    a, b = subscribe(q, "a", 10), subscribe(q, "b", 1)
    assert choosing.choose_avoiding(q, None, "a") is b
    b.used = 1
    assert choosing.choose_avoiding(q, None, "a") is a  # nobody else: it goes back
    assert choosing.choose_for(q, None, 5, avoid="a") is a and q.matches == 0  # no filters: none evaluated


def test_old_messages_expire_at_the_fronts_at_once_and_in_groups_at_the_sweep():
    q = queue(expiration_ms=10)
    gid = q.group_id("g")
    entering.enqueue(q, 1, 0)
    entering.enqueue(q, 2, gid)
    entering.enqueue(q, 3, gid)
    subscribe(q, "s", 1)
    q.dispatch(0)  # 1 goes; 2 and 3 wait (2 in the fifo, 3 parked behind nobody: the fifo)
    q.group_sweep_due_ms = 100
    expiry.expire_old(q, 2, now_ms=50)
    assert [e[0] for e in q.expired_out] == [2]  # the fifo's front, at once
    expiry.expire_old(q, 3, now_ms=100)
    assert [e[0] for e in q.expired_out] == [2, 3]
    assert q.group_sweep_due_ms == 100 + limits.EXPIRY_SWEEP_INTERVAL_MS


def test_a_browser_walks_every_message_and_takes_none():
    q = queue(browse_only=True)
    sub = subscribe(q, "b", 2)
    for seq in (1, 2, 3):
        entering.enqueue(q, seq, 0)
    q.dispatch(0)
    assert taken(sub) == [1, 2] and q.lease_of == {}
    assert browse.settle(q, sub, 9) == "not-leased"
    assert q.ack(sub, 1) is None and sub.used == 1  # credit back, message stays
    q.dispatch(0)
    assert taken(sub) == [3]
    assert sorted(inventory.waiting_set(q)) == [1, 2, 3]


def test_the_inventory_reads_every_place_in_order_and_the_recovery_point_counts_leases():
    q = queue()
    gid = q.group_id("g")
    for seq, g in ((1, gid), (2, gid), (3, 0), (4, gid)):
        entering.enqueue(q, seq, g)
    sub = subscribe(q, "s", 1)
    q.dispatch(0)
    assert taken(sub) == [1]  # 2 and 4 wait behind it, parked in their group
    assert list(inventory.waiting(q)) == [2, 3, 4]
    assert list(inventory.waiting_between(q, 1, 4, gid)) == [(2, gid)]
    assert list(inventory.waiting_between(q, 0, 10, 0)) == [(3, 0)]
    assert inventory.compute_recovery_point(q, 5) == 1  # leased 1 is still in the queue
    assert inventory.oldest_waiting(q) == 2
    assert inventory.group_summary(q)["in_flight"] == 1


def test_a_sequenced_group_waits_for_its_full_holder_and_goes_on_when_it_settles():
    q = queue()
    a, b = subscribe(q, "a", 1), subscribe(q, "b", 5)
    gid = q.group_id("g")
    for seq in (1, 2, 3):
        entering.enqueue(q, seq, gid)
    q.dispatch(0)
    assert taken(a) == [1] and taken(b) == []  # b has credit, but the group is a's while a holds some
    assert q.groups[gid].owner is a and not grouping.can_go(q, q.groups[gid])
    assert gid in a.waiting_groups  # parked for a's credit
    assert q.ack(a, 1) is None
    assert q.groups[gid].owner is None  # holds none of it now: the group may go to anyone
    q.dispatch(0)
    assert taken(a) + taken(b) == [2]  # its next goes to a new holder, and 3 waits behind it again


def test_a_group_with_nothing_left_is_forgotten():
    q = queue()
    sub = subscribe(q, "s", 5)
    gid = q.group_id("g")
    entering.enqueue(q, 1, gid)
    q.dispatch(0)
    assert taken(sub) == [1]
    assert q.ack(sub, 1) is None
    assert gid not in q.groups and "g" not in q.gid_of


def test_a_lease_counts_each_delivery_and_release_gives_the_credit_back():
    q = queue()
    sub = subscribe(q, "s", 2)
    entering.enqueue(q, 1, 0)
    q.dispatch(0)
    assert q.take_outbox(sub) == ([1], [1])
    assert sub.used == 1 and q.lease_of[1].deadline_ms == 1_000
    lease, m = leases.release(q, 1)
    assert sub.used == 0 and 1 not in q.lease_of and m & 0xFFFF == 1
    settling.put_back(q, 1, m)
    q.dispatch(5)
    assert q.take_outbox(sub) == ([1], [2])  # delivered again: its count is the new delivery's epoch


def test_extend_moves_only_the_holders_messages_and_not_past_the_maximum_age():
    q = queue(max_lease_age_ms=5_000)
    a, b = subscribe(q, "a", 1), subscribe(q, "b", 1)
    for seq in (1, 2):
        entering.enqueue(q, seq, 0)
    q.dispatch(100)
    mine = taken(a)[0]
    theirs = 3 - mine
    assert leases.extend(q, a, [mine, theirs, 99], 60_000) == [theirs, 99]
    assert q.lease_of[mine].deadline_ms == 100 + 5_000


def test_the_retry_schedule_is_deterministic_and_spread_within_the_jitter():
    q = queue(backoff_ms=[1_000, 4_000], backoff_jitter=0.1)
    waits = [delaying.retry_delay_ms(q, seq, 1) for seq in range(1, 500)]
    assert min(waits) >= 900 and max(waits) <= 1_100 and len(set(waits)) > 50
    assert delaying.retry_delay_ms(q, 7, 9) == delaying.retry_delay_ms(q, 7, 9) and 3_600 <= delaying.retry_delay_ms(q, 7, 9) <= 4_400


def test_a_delayed_message_sleeps_and_wakes_at_its_time_in_its_place():
    q = queue()
    sub = subscribe(q, "s", 5)
    entering.enqueue(q, 1, 0)
    entering.enqueue(q, 2, 0)
    delaying.mark(q, 1, 0, 500, "requested")
    q.dispatch(0)
    assert taken(sub) == [2] and delaying.due_of(q, 1) == 500
    delaying.wake_due(q, 499)
    q.dispatch(499)
    assert taken(sub) == []
    delaying.wake_due(q, 500)
    q.dispatch(500)
    assert taken(sub) == [1] and delaying.due_of(q, 1) is None


def test_a_settle_of_a_delivery_no_longer_live_is_fenced_off_and_answered_lost():
    q = queue()
    sub = subscribe(q, "s", 5)
    entering.enqueue(q, 1, 0)
    q.dispatch(0)
    taken(sub)
    assert settling.cancel(q, sub, 1, now_ms=0, delay_ms=0) is None
    q.dispatch(0)
    taken(sub)  # delivery 2 is live now
    stale: list[int] = []
    assert settling.ack_many(q, sub, [1], epochs=[1], stale=stale) == [] and stale == [1]
    assert settling.settle_result(q, 1, 2) == "lost"
    assert settling.ack_many(q, sub, [1], epochs=[2]) == []
    assert settling.settle_result(q, 1, 2) == "done" and settling.settle_result(q, 5, 2) == "unknown"


def test_a_removed_message_stops_counting_at_once_and_is_dropped_when_reached():
    q = queue()
    sub = subscribe(q, "s", 5)
    gid = q.group_id("g")
    for seq, g in ((1, 0), (2, gid), (3, 0)):
        entering.enqueue(q, seq, g)
    assert removal.remove_available(q, 2, gid=gid) and not removal.remove_available(q, 2)
    assert q.depth == 2 and q.groups[gid].count == 0 and removal.is_waiting(q, 3)
    q.dispatch(0)
    assert taken(sub) == [1, 3] and q.removed == set() and gid not in q.groups


def test_a_queue_ranks_by_priority_sort_key_or_fair_share_and_a_fifo_not_at_all():
    assert entering.ranking(QueueSettings(name="q")) == (None, None, None)
    level_fn, priority_fn, fair = entering.ranking(QueueSettings(name="q", priority="/p"))
    # a lower level goes first: the higher priority
    assert fair is None and priority_fn is not None and level_fn({}, b'{"p": 7}', "q") < level_fn({}, b'{"p": 1}', "q")
    level_fn, _, fair = entering.ranking(QueueSettings(name="q", sort_key="k"))
    assert fair is None and level_fn({"k": "a"}, b"", "q") < level_fn({"k": "b"}, b"", "q")
    level_fn, priority_fn, fair = entering.ranking(QueueSettings(name="q", tenant_header="t", priority="/p"))
    assert level_fn is None and priority_fn is not None and fair is not None  # a fair queue ages the priority itself


def test_the_group_policies_say_who_holds_a_group():
    assert grouping.policy("exclusive") == (True, True, False)
    assert grouping.policy("sequenced") == (False, True, True)
    assert grouping.policy("one-in-flight") == (False, False, False)


def test_a_late_settle_is_told_dead_only_for_the_recently_dead():
    dead = settling.RecentlyDead()
    for seq in range(1, limits.DEAD_REMEMBERED + 3):
        dead.remember(seq)
    dead.remember(limits.DEAD_REMEMBERED + 2)  # again: not twice
    assert len(dead.seqs) == len(dead.order) == limits.DEAD_REMEMBERED
    assert 1 not in dead.seqs and 2 not in dead.seqs and 3 in dead.seqs  # the oldest forgotten first


def test_past_its_target_depth_a_queue_keeps_new_messages_in_the_journal_only():
    q = queue(target_queue_depth=2)
    for seq in (1, 2):
        assert q.target.admit(seq)
        entering.enqueue(q, seq, 0)
    assert not q.target.admit(3) and not q.target.admit(4)
    assert (q.target.inactive, q.target.cursor, q.depth, q.published) == (2, 3, 2, 4)


def test_a_last_value_replaces_the_older_waiting_one_and_marks_a_leased_one_superseded():
    q = queue(lvq_key="k")
    sub = subscribe(q, "s", 1)
    entering.enqueue(q, 1, 0)
    q.last_values.admit(1, "a")
    q.dispatch(0)
    assert taken(sub) == [1]
    entering.enqueue(q, 2, 0)
    q.last_values.admit(2, "a")  # 1 is leased: it stays with its holder
    assert q.last_values.superseded(1) and not q.last_values.superseded(2)
    entering.enqueue(q, 3, 0)
    q.last_values.admit(3, "a")  # 2 waits: it leaves, replaced
    assert q.last_values.replaced == 1 and [e[:2] for e in q.expired_out] == [(2, "replaced")]


def test_a_barrier_waits_for_every_earlier_ack_then_goes_to_every_subscriber():
    q = queue(barrier="barrier")
    a, b = subscribe(q, "a", 5), subscribe(q, "b", 5)
    for seq in (1, 2, 3):
        entering.enqueue(q, seq, 0)
    q.barrier.waiting.append(2)
    q.dispatch(0)
    first = taken(a) + taken(b)
    assert first == [1] and q.barrier.gate(2) is True  # 1 is out: the barrier and 3 wait
    holder = a if 1 in q.lease_of and q.lease_of[1].sub is a else b
    assert q.ack(holder, 1) is None
    q.dispatch(0)
    assert a.barrier_out == [2] and b.barrier_out == [2] and q.barrier.released == 1
    assert sorted(taken(a) + taken(b)) == [3]


def test_the_size_limits_count_bytes_and_ring_drops_the_oldest():
    q = queue(max_bytes=100, overflow="ring")
    for seq in (1, 2, 3):
        entering.enqueue(q, seq, 0)
        q.overflow.sizes[seq] = 40
        q.overflow.bytes += 40
    assert q.overflow.over() and q.overflow.would_overflow(0, 1) and not q.overflow.over(percent=150)
    q.overflow.make_room()
    assert q.overflow.dropped == 1 and q.overflow.bytes == 80 and inventory.waiting_set(q) == {2, 3}
