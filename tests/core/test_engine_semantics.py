"""One test (or a few) per queue semantic of the engine; time is an input."""

import pytest

from zq.core import QueueSettings
from zq.core import choosing
from zq.core import records as R
from zq.core.errors import ConfigError, LimitError, ProtocolError, UnknownQueueError, UnknownSubscriptionError

from .helpers import Harness


def q(name="jobs", **kw):
    return QueueSettings(name=name, **kw)


# ------------------------------------------------------------ topics and queues


def test_a_queue_covers_topics_by_regex_and_two_queues_track_one_topic_independently():
    h = Harness(q("all", topics="orders\\..*"), q("eu", topics="orders\\.eu"))
    eu, us = h.pub("orders.eu")[0], h.pub("orders.us")[0]
    h.sub("a", "all", 10)
    h.sub("e", "eu", 10)
    got = h.drain()
    assert got == {"a": [eu, us], "e": [eu]}
    h.engine.ack("e", [eu], h.now)
    assert h.engine.queues["all"].lease_of.keys() == {eu, us}  # acking in one queue leaves the other


def test_publishing_to_a_queue_name_goes_to_its_default_publish_target():
    h = Harness(q("work", topics="work\\.in", publish_to="work.in"))
    seq = h.pub("work")[0]
    h.sub("s", "work")
    assert h.drain() == {"s": [seq]}
    assert h.records[0].topic == "work.in"


def test_publish_and_subscribe_auto_create_a_queue_that_holds_the_topic_from_the_start():
    h = Harness()
    first = h.pub("jobs")[0]
    assert "jobs" in h.engine.queues
    h.sub("s", "jobs")
    assert h.drain() == {"s": [first]}
    s = h.engine.queues["jobs"].settings
    assert (s.semantics, s.effective_fairness(), s.lease_ms, s.max_per_subscription_backlog) == (
        "at-least-once", "proportional", 30_000, 100)
    assert (s.max_deliveries, s.dead_letter) == (20, "jobs.dead")
    assert any(isinstance(r, R.QueueDeclared) for r in h.records)


def test_without_auto_queues_an_unknown_queue_is_refused_clearly():
    h = Harness(q("jobs"), auto_queues=False)
    with pytest.raises(UnknownQueueError, match="nope"):
        h.sub("s", "nope")


# ------------------------------------------------------------ delivery semantics


def test_at_least_once_lease_expiry_returns_the_message_and_it_is_delivered_again():
    h = Harness(q(lease_ms=100))
    seq = h.pub("jobs")[0]
    h.sub("s", "jobs")
    assert h.drain() == {"s": [seq]}
    h.advance(99)
    assert h.drain() == {}
    h.advance(1)
    assert h.drain() == {"s": [seq]}
    assert h.engine.queues["jobs"].deliveries_of(seq) == 2
    assert [e.kind for e in h.records if isinstance(e, R.Event)] == [R.LEASED, R.LEASE_EXPIRED, R.LEASED]


def test_ack_removes_the_message_for_good():
    h = Harness(q(lease_ms=100))
    seq = h.pub("jobs")[0]
    h.sub("s", "jobs")
    h.drain()
    assert h.engine.ack("s", [seq], h.now) == []
    h.advance(1000)
    assert h.drain() == {}
    assert h.engine.queues["jobs"].depth == 0 and not h.engine.queues["jobs"].lease_of


def test_at_most_once_removes_on_delivery_and_ack_only_frees_backlog():
    h = Harness(q(semantics="at-most-once", lease_ms=100))
    a, b = h.pub("jobs", 2)
    h.sub("s", "jobs", 1)
    assert h.drain() == {"s": [a]}
    h.advance(500)  # the credit times out; the message is not delivered again
    assert h.drain() == {"s": [b]}
    h.engine.ack("s", [b], h.now)
    assert h.drain() == {} and h.engine.queues["jobs"].depth == 0


def test_at_most_once_accepts_round_robin_only():
    with pytest.raises(ConfigError, match="round-robin"):
        q(semantics="at-most-once", fairness="proportional").validate()
    assert q(semantics="at-most-once").effective_fairness() == "round-robin"


# ------------------------------------------------------------ backlog and fairness


def test_backlog_is_the_smaller_of_queue_limit_and_subscriber_max_and_is_never_exceeded():
    h = Harness(q(max_per_subscription_backlog=3))
    h.pub("jobs", 10)
    assert h.sub("big", "jobs", 50) == 3
    assert h.sub("small", "jobs", 2) == 2
    got = h.drain()
    assert len(got["big"]) == 3 and len(got["small"]) == 2
    assert h.drain() == {}


def test_proportional_fairness_picks_the_highest_unused_fraction_amps_example():
    # AMPS docs: backlogs 2/4/10 with 1/3/4 leased -> the third has the most room (60%).
    h = Harness(q(max_per_subscription_backlog=10, lease_ms=10**9))
    for name, backlog in (("a", 2), ("b", 4), ("c", 10)):
        h.sub(name, "jobs", backlog)
    sizes = {"a": 1, "b": 3, "c": 4}
    queue = h.engine.queues["jobs"]
    for sub in queue.subs:
        sub.used = sizes[sub.sub_id]  # arrange the leased counts of the example
    assert choosing.choose(queue, None).sub_id == "c"


def test_proportional_ties_go_to_the_first_found():
    h = Harness(q(max_per_subscription_backlog=10))
    h.sub("a", "jobs", 4)
    h.sub("b", "jobs", 4)
    h.pub("jobs", 1)
    assert h.drain() == {"a": [1]}


def test_fast_fills_the_first_subscription_with_room_first():
    h = Harness(q(fairness="fast", max_per_subscription_backlog=10))
    h.sub("a", "jobs", 3)
    h.sub("b", "jobs", 3)
    seqs = h.pub("jobs", 4)
    assert h.drain() == {"a": seqs[:3], "b": seqs[3:]}


def test_round_robin_alternates_between_subscriptions_with_room():
    h = Harness(q(fairness="round-robin", max_per_subscription_backlog=10))
    h.sub("a", "jobs", 5)
    h.sub("b", "jobs", 5)
    seqs = h.pub("jobs", 4)
    assert h.drain() == {"a": [seqs[0], seqs[2]], "b": [seqs[1], seqs[3]]}


# ------------------------------------------------------------ ordering


def test_a_returned_message_keeps_its_place_ahead_of_newer_ones():
    h = Harness(q(lease_ms=10**6))
    a, b, c = h.pub("jobs", 3)
    h.sub("s", "jobs", 1)
    assert h.drain() == {"s": [a]}
    h.engine.cancel("s", [a], h.now)
    assert h.drain() == {"s": [a]}  # not b: a went back to the head
    h.engine.ack("s", [a], h.now)
    assert h.drain() == {"s": [b]}


def test_disconnect_breaks_leases_at_once_and_messages_return_in_order():
    h = Harness(q(max_per_subscription_backlog=10, lease_ms=10**6))
    seqs = h.pub("jobs", 4)
    h.sub("dead", "jobs", 3, consumer="w1")
    assert h.drain() == {"dead": seqs[:3]}
    h.sub("alive", "jobs", 10, consumer="w2")
    assert h.drain() == {"alive": [seqs[3]]}
    h.engine.disconnect("w1", h.now)
    assert h.drain() == {"alive": seqs[:3]}
    assert len(h.events(R.RETURNED)[0].bookmarks) == 3


# ------------------------------------------------------------ acks, cancels, expiry


def test_acking_a_message_you_do_not_lease_is_refused_unless_the_queue_allows_it():
    h = Harness(q(), q("lenient", allow_ack_unleased=True))
    a = h.pub("jobs")[0]
    b = h.pub("lenient")[0]
    h.sub("s", "jobs")
    h.sub("t", "lenient")
    h.engine.subscribe("other", "jobs", "o", 1, h.now)
    h.drain()
    assert h.engine.ack("other", [a], h.now) == [a]
    assert h.engine.ack("s", [999], h.now) == [999]
    c = h.pub("lenient")[0]  # waiting, not leased
    assert h.engine.ack("t", [c], h.now) == []
    h.engine.ack("t", [b], h.now)
    assert h.drain() == {} and h.engine.queues["lenient"].depth == 0


def test_acks_for_an_unknown_subscription_are_a_clear_error():
    h = Harness(q())
    with pytest.raises(UnknownSubscriptionError):
        h.engine.ack("ghost", [1], 0)


def test_cancel_counts_toward_max_cancels_then_the_message_expires_and_is_dead_lettered():
    h = Harness(q(max_cancels=2, dead_letter="jobs.failed", lease_ms=10**6))
    seq = h.pub("jobs")[0]
    h.sub("s", "jobs")
    for _ in range(2):
        assert h.drain() == {"s": [seq]}
        h.engine.cancel("s", [seq], h.now)
    h.drain()
    expired = h.events(R.EXPIRED)
    assert [(e.bookmarks, e.reason) for e in expired] == [([seq], R.REASON_MAX_CANCELS)]
    dead = [r for r in h.records if isinstance(r, R.Message) and r.topic == "jobs.failed"]
    assert len(dead) == 1 and dead[0].copy_of == seq
    assert dead[0].headers == {"zq.reason": "max-cancels", "zq.queue": "jobs", "zq.deliveries": "2", "zq.bookmark": str(seq),
                               "zq.cancelled": "2", "zq.failed": "0", "zq.lease_expired": "0", "zq.consumer_gone": "0",
                               "zq.first_failure_ms": "0", "zq.last_failure_ms": "0", "zq.consumer": "s"}
    assert h.engine.queues["jobs.failed"].depth == 1  # the dead-letter queue holds it


def test_max_deliveries_expires_a_message_whose_leases_keep_breaking():
    h = Harness(q(max_deliveries=3, lease_ms=10, dead_letter="dlq"))
    seq = h.pub("jobs")[0]
    h.sub("s", "jobs")
    for _ in range(3):
        assert h.drain() == {"s": [seq]}
        h.advance(10)
    h.drain()
    assert [e.reason for e in h.events(R.EXPIRED)] == [R.REASON_MAX_DELIVERIES]
    assert h.engine.queues["dlq"].depth == 1


def test_expire_removes_now_with_reason_expire_requested():
    h = Harness(q(dead_letter="dlq"))
    seq = h.pub("jobs")[0]
    h.sub("s", "jobs")
    h.drain()
    assert h.engine.expire("s", [seq], h.now) == []
    h.drain()
    assert [e.reason for e in h.events(R.EXPIRED)] == [R.REASON_REQUESTED]
    assert h.engine.queues["jobs"].depth == 0 and h.engine.queues["dlq"].depth == 1


def test_expiration_removes_old_waiting_messages_without_any_subscriber():
    h = Harness(q(expiration_ms=1000, dead_letter="dlq"))
    old = h.pub("jobs")[0]
    h.advance(600)
    young = h.pub("jobs")[0]
    h.advance(399)
    h.drain()
    assert h.engine.queues["jobs"].depth == 2
    h.advance(1)
    h.drain()
    assert [e.bookmarks for e in h.events(R.EXPIRED)] == [[old]]
    assert [seq for seq, _ in h.engine.peek("jobs", 10)] == [young]
    assert h.engine.next_deadline_ms() == 1600


def test_a_leased_message_past_its_expiration_expires_when_its_lease_ends():
    h = Harness(q(expiration_ms=100, lease_ms=500))
    seq = h.pub("jobs")[0]
    h.sub("s", "jobs")
    h.drain()
    h.advance(200)
    assert h.drain() == {} and not h.events(R.EXPIRED)  # still leased: the holder may finish
    h.advance(300)
    h.drain()
    assert [e.bookmarks for e in h.events(R.EXPIRED)] == [[seq]]


def test_extend_keeps_a_lease_past_its_original_end():
    h = Harness(q(lease_ms=100))
    seq = h.pub("jobs")[0]
    h.sub("s", "jobs")
    h.drain()
    assert h.engine.extend("s", [seq], 1000, h.now) == []
    h.advance(500)
    assert h.drain() == {}
    assert h.engine.ack("s", [seq], h.now) == []
    assert h.engine.extend("s", [seq], 1000, h.now) == [seq]  # nothing left to extend
    with pytest.raises(ProtocolError):
        h.engine.extend("s", [seq], 0, h.now)


def test_next_deadline_is_the_earliest_lease_end():
    h = Harness(q(lease_ms=250))
    assert h.engine.next_deadline_ms() is None
    h.pub("jobs")
    h.sub("s", "jobs")
    h.drain()
    assert h.engine.next_deadline_ms() == 250


# ------------------------------------------------------------ message groups


def test_a_one_in_flight_group_never_has_two_messages_out_and_the_next_may_go_to_any_consumer():
    h = Harness(q(fairness="round-robin", max_per_subscription_backlog=10, lease_ms=10**6, group_policy="one-in-flight"))
    a1, a2 = h.pub("jobs", 2, group="A")
    h.sub("x", "jobs", 5)
    h.sub("y", "jobs", 5)
    assert h.drain() == {"x": [a1]}  # a2 waits although y has room
    h.engine.ack("x", [a1], h.now)
    assert h.drain() == {"y": [a2]}


def test_a_sequenced_group_is_held_by_one_consumer_up_to_its_credit_then_free_for_anyone():
    """Qpid's QIP, policy 2: the holder may take the group's next messages up to its
    credit; nobody else gets any until the holder holds none of the group."""
    h = Harness(q(fairness="round-robin", max_per_subscription_backlog=10, lease_ms=10**6))
    a = h.pub("jobs", 5, group="A")
    h.sub("x", "jobs", 3)
    h.sub("y", "jobs", 3)
    assert h.drain() == {"x": a[:3]}  # x holds A: y gets none although it has room
    h.engine.ack("x", a[:1], h.now)
    assert h.drain() == {"x": [a[3]]}  # still the holder (it holds a[1], a[2])
    h.engine.ack("x", a[1:4], h.now)
    assert h.engine.group_list("jobs")[0]["owner"] is None  # holds none: free
    assert h.drain() == {"y": [a[4]]}  # round-robin: y's turn, and A may go to anyone now


def test_the_qpid_sequenced_consumers_trace():
    """qpid-python's shared-groups broker test, in zq terms: two consumers claiming one
    message at a time; groups A A A B B B C C C published in that order."""
    h = Harness(q(max_per_subscription_backlog=10, lease_ms=10**6))
    seq = {}
    for name in ("A-0", "A-1", "A-2", "B-3", "B-4", "B-5", "C-6", "C-7", "C-8"):
        seq[name] = h.pub("jobs", group=name[0])[0]
    name_of = {v: k for k, v in seq.items()}

    def take(c: str) -> str:
        h.engine.claim(c, "jobs", c, 1, 10**6, h.now)
        got = h.drain()
        h.engine.end_claim(c)
        assert list(got) == [c] and len(got[c]) == 1, got
        return name_of[got[c][0]]

    def ack(c: str, name: str) -> None:
        assert h.engine.ack(c, [seq[name]], h.now) == []

    assert take("c1") == "A-0"
    assert take("c2") == "B-3"
    ack("c1", "A-0")
    assert take("c2") == "A-1"
    assert take("c1") == "C-6"
    ack("c2", "B-3")
    assert take("c1") == "B-4"
    ack("c1", "C-6")
    assert take("c2") == "A-2"  # c2 holds A through A-1: A-2 is its (zq once gave it C-7)


def test_a_cancelled_message_of_a_sequenced_group_keeps_its_place_and_its_holder():
    h = Harness(q(max_per_subscription_backlog=10, lease_ms=10**6))
    a = h.pub("jobs", 3, group="A")
    h.sub("x", "jobs", 2)
    h.sub("y", "jobs", 5)
    assert h.drain() == {"x": a[:2]}
    h.engine.cancel("x", [a[0]], h.now)  # x still holds a[1]: the group stays x's
    assert h.drain() == {"x": [a[0]]}
    h.engine.cancel("x", a[:2], h.now)  # x holds none now: the group goes, from a[0] in order, to one consumer
    got = h.drain()
    assert len(got) == 1
    (holder, taken), = got.items()
    assert taken == a[: len(taken)] and len(taken) == min(3, {"x": 2, "y": 5}[holder])


def test_a_busy_group_never_blocks_other_groups_or_ungrouped_messages_behind_it():
    h = Harness(q(max_per_subscription_backlog=10, lease_ms=10**6, group_policy="one-in-flight"))
    a1 = h.pub("jobs", group="A")[0]
    a2 = h.pub("jobs", group="A")[0]
    b1 = h.pub("jobs", group="B")[0]
    u = h.pub("jobs")[0]
    h.sub("s", "jobs", 10)
    assert h.drain() == {"s": [a1, b1, u]}
    h.engine.ack("s", [a1], h.now)
    assert h.drain() == {"s": [a2]}


def test_one_in_flight_group_order_survives_a_cancel():
    h = Harness(q(max_per_subscription_backlog=10, lease_ms=10**6, group_policy="one-in-flight"))
    a1, a2, a3 = h.pub("jobs", 3, group="A")
    h.sub("s", "jobs", 10)
    assert h.drain() == {"s": [a1]}
    h.engine.cancel("s", [a1], h.now)
    assert h.drain() == {"s": [a1]}
    h.engine.ack("s", [a1], h.now)
    assert h.drain() == {"s": [a2]}


def test_exclusive_group_sticks_to_its_first_consumer_and_moves_in_order_when_it_dies():
    h = Harness(q(group_policy="exclusive", max_per_subscription_backlog=10, lease_ms=10**6))
    h.sub("x", "jobs", 2, consumer="wx")
    h.sub("y", "jobs", 10, consumer="wy")
    a = h.pub("jobs", 4, group="A")
    got = h.drain()
    assert got == {"x": a[:2]}  # x owns A; y waits although it has room
    h.engine.ack("x", [a[0]], h.now)
    assert h.drain() == {"x": [a[2]]}
    h.engine.disconnect("wx", h.now)
    assert h.drain() == {"y": [a[1], a[2], a[3]]}  # unacked ones, in order, to another


def test_messages_without_the_group_header_are_ungrouped():
    h = Harness(q(group_header="customer", max_per_subscription_backlog=10, lease_ms=10**6))
    seqs = h.pub("jobs", 3, group="ignored-header")
    h.sub("s", "jobs", 10)
    assert h.drain() == {"s": seqs}  # 'group' is not this queue's header


def test_group_ceiling_refuses_a_new_group_before_anything_is_journaled():
    h = Harness(q(max_groups=2))
    h.pub("jobs", group="a")
    h.pub("jobs", group="b")
    before = h.engine.next_seq
    with pytest.raises(LimitError, match="max_groups"):
        h.pub("jobs", group="c")
    assert h.engine.next_seq == before
    h.pub("jobs", group="a")  # known groups still go


def test_finished_groups_are_forgotten_so_memory_follows_live_groups():
    h = Harness(q(max_per_subscription_backlog=100))
    seqs = [h.pub("jobs", group=f"g{i}")[0] for i in range(50)]
    h.sub("s", "jobs", 100)
    h.drain()
    h.engine.ack("s", seqs, h.now)
    assert len(h.engine.queues["jobs"].groups) == 0


# ------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    ("topic", "payload", "headers", "error"),
    [
        ("", b"x", {}, ProtocolError),
        ("t" * 600, b"x", {}, LimitError),
        ("jobs", b"x", {"zq.reason": "forged"}, ProtocolError),
        ("jobs", b"x", {f"h{i}": "v" for i in range(100)}, LimitError),
        ("jobs", b"x" * (16 * 1024 * 1024 + 1), {}, LimitError),
    ],
    ids=["empty-topic", "long-topic", "reserved-header", "too-many-headers", "oversized"],
)
def test_bad_publishes_get_a_clear_error_and_journal_nothing(topic, payload, headers, error):
    h = Harness()
    with pytest.raises(error):
        h.engine.publish(topic, payload, headers, 0)
    assert h.engine.drain(0).records == [] or all(not isinstance(r, R.Message) for r in h.engine.drain(0).records)
    assert h.engine.next_seq == 1


def test_subscription_ids_are_unique_and_backlog_must_be_positive():
    h = Harness(q())
    h.sub("s", "jobs")
    with pytest.raises(ProtocolError, match="already"):
        h.sub("s", "jobs")
    with pytest.raises(ProtocolError, match="max_backlog"):
        h.sub("t", "jobs", 0)


@pytest.mark.parametrize(
    ("kw", "key"),
    [
        ({"semantics": "twice"}, "semantics"),
        ({"fairness": "random"}, "fairness"),
        ({"group_policy": "sticky"}, "group_policy"),
        ({"lease_ms": 0}, "lease"),
        ({"max_per_subscription_backlog": 0}, "max_per_subscription_backlog"),
        ({"max_cancels": -1}, "max_cancels"),
    ],
)
def test_invalid_queue_settings_name_the_offending_key(kw, key):
    with pytest.raises(ConfigError, match=key):
        q(**kw).validate()


def test_stats_count_what_happened_per_queue():
    h = Harness(q(lease_ms=10**6))
    a, b = h.pub("jobs", 2)
    h.sub("s", "jobs", 2)
    h.drain()
    h.engine.ack("s", [a], h.now)
    h.engine.cancel("s", [b], h.now)
    h.drain()
    st = h.engine.stats()["queues"]["jobs"]
    assert (st["published"], st["acked"], st["cancelled"], st["leased"], st["redelivered"]) == (2, 1, 1, 1, 1)
    assert st["consumers"][0]["used"] == 1


def test_the_time_index_forgets_finished_messages_so_memory_stays_bounded():
    h = Harness(q(max_per_subscription_backlog=100, lease_ms=10**9))
    h.sub("s", "jobs", 100)
    for _ in range(5000):
        h.now += 1
        seqs = h.pub("jobs")
        h.drain()
        h.engine.ack("s", seqs, h.now)
    h.now += 2000
    h.drain()  # writes recovery points, prunes
    assert len(h.engine.ti_ms) < 1100


def test_events_carry_the_name_a_consumer_gave_until_its_last_event_is_out():
    h = Harness(q(max_per_subscription_backlog=10, lease_ms=10**6))
    h.pub("jobs", 3)
    h.engine.subscribe("c1/s", "jobs", "c1", 2, h.now, consumer_name="host-a:101")
    h.engine.subscribe("c2/s", "jobs", "c2", 1, h.now)  # gave no name
    out = h.engine.drain(h.now)
    leased = {e.consumer: e.consumer_name for e in out.records if type(e) is R.Event and e.kind == R.LEASED}
    assert leased == {"c1": "host-a:101", "c2": ""}
    h.engine.disconnect("c1", h.now)  # its leases come back: that event still names it
    out = h.engine.drain(h.now)
    names = {e.consumer_name for e in out.records if type(e) is R.Event and e.consumer == "c1"}
    assert names == {"host-a:101"} and "c1" not in h.engine.consumer_names  # then forgotten: bounded


def test_measured_latencies_keep_two_significant_digits_and_count_every_ack():
    from zq.core.engine import latency_key

    assert [latency_key(ms) for ms in (0, 7, 99, 100, 137, 999, 4_180, 61_234)] == [0, 7, 99, 100, 130, 990, 4_100, 61_000]
    h = Harness(q(max_per_subscription_backlog=10, lease_ms=10**6))
    first = h.pub("jobs", 3)  # published at 0 ms
    h.now = 5
    later = h.pub("jobs", 2)  # at 5 ms
    h.sub("s", "jobs", 10)
    h.drain()
    h.now = 1_234
    h.engine.ack("s", [*first, *later], h.now)
    lat = h.engine.stats()["queues"]["jobs"]["ack_latency"]
    assert lat["ms"] == {1_200: 5} and sum(lat["counts"]) == 5 and lat["sum_ms"] == 3 * 1_234 + 2 * 1_229


def test_stats_show_ack_latency_oldest_age_processing_time_and_busy_groups():
    h = Harness(q(max_per_subscription_backlog=10, lease_ms=10**6, group_policy="one-in-flight"))
    a = h.pub("jobs", group="g1")[0]
    h.pub("jobs", 2, group="g1")
    h.now = 40
    h.sub("s", "jobs", 10)
    h.drain()
    h.now = 70
    h.engine.ack("s", [a], h.now)
    st = h.engine.stats()["queues"]["jobs"]
    lat = st["ack_latency"]
    assert sum(lat["counts"]) == 1 and lat["sum_ms"] == 70
    assert lat["counts"][lat["buckets_ms"].index(100)] == 1  # 70 ms falls in the <=100 ms bucket
    assert lat["ms"] == {70: 1}  # and is kept as measured, for zq top's percentiles
    assert st["consumers"][0]["busy_ms"] == 30
    assert st["oldest_ms"] == 70
    assert st["group_summary"]["busiest"] == [{"group": "g1", "pending": 2, "owner": None}]  # count - in flight


def test_a_consumer_leaving_takes_all_its_subscriptions_out_at_once_and_the_others_keep_their_order():
    """``disconnect`` takes a consumer's subscriptions out of each queue's list in one
    pass (a session with a thousand claims once scanned a 100,000-entry list a thousand
    times); what they held returns in order, and the other subscriptions keep theirs."""
    from .helpers import Harness

    h = Harness()
    for i in range(6):
        h.sub(f"a{i}", "jobs", backlog=1, consumer="a")
        h.sub(f"b{i}", "jobs", backlog=1, consumer="b")
    seqs = h.pub("jobs", 12)
    got = h.drain()
    held_by_a = sorted(s for k, v in got.items() if k.startswith("a") for s in v)
    h.engine.disconnect("a", h.now)
    q = h.engine.queues["jobs"]
    assert [s.sub_id for s in q.subs] == [f"b{i}" for i in range(6)]
    h.sub("late", "jobs", backlog=12, consumer="c")
    assert h.drain() == {"late": held_by_a} and len(held_by_a) == 6 and set(held_by_a) < set(seqs)
