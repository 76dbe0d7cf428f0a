"""The parts an ``Engine`` is made of (zq.core.engine), each on its own, on a real
engine: ``TimeIndex`` (publish times by bookmark), ``Routes`` (topic -> queues,
auto-created and provisional queues), ``Admission`` (publishing: checks, dedup,
overflow), ``Subscriptions`` (and claims), ``Outputs`` (outboxes into records),
``RecoveryPoints`` and ``Replay`` (recovery), ``Views`` (stats, peek, query)."""

from __future__ import annotations

import pytest

from zq.core import QueueSettings
from zq.core import inventory, limits
from zq.core import records as R
from zq.core.engine import Engine
from zq.core.errors import LimitError, ProtocolError, QueueFullError, ReservedNameError
from zq.core.queue import Queue
from zq.core.recovery import Replay, fold_event, load_declared
from zq.core.timeindex import TimeIndex, latency_key

from .helpers import Harness

# ------------------------------------------------------------------ TimeIndex


def test_the_time_index_keeps_one_entry_per_millisecond_and_answers_by_bisection():
    t = TimeIndex()
    for ms, seq in ((100, 1), (100, 2), (105, 3), (105, 4), (110, 5)):
        t.note(ms, seq)
    assert (list(t.ms), list(t.seqs)) == ([100, 105, 110], [1, 3, 5])
    assert [t.publish_time_ms(s, 999) for s in (1, 2, 4, 5, 9)] == [100, 100, 105, 110, 110]
    assert t.publish_time_ms(0, 999) == 999  # before the index: "now"
    t.note(90, 6)  # time never runs backwards in the index
    assert list(t.ms) == [100, 105, 110]


def test_the_watermark_is_the_last_bookmark_published_before_the_expiration():
    t = TimeIndex()
    q = Queue(QueueSettings(name="q", expiration_ms=10))
    for ms, seq in ((100, 1), (105, 3), (110, 5)):
        t.note(ms, seq)
    assert t.watermark_at(q, 109, next_seq=7) == -1  # nothing older than 10 ms at 109
    assert t.watermark_at(q, 110, next_seq=7) == 2  # the 100 ms entry: seqs 1..2
    assert t.watermark_at(q, 120, next_seq=7) == 6  # everything so far
    assert t.watermark_at(Queue(QueueSettings(name="never")), 10**9, next_seq=7) == -1


def test_pruning_keeps_the_entry_covering_the_lowest_bookmark():
    t = TimeIndex()
    for i in range(3000):
        t.note(i, 10 * i)
    t.prune(10 * 2000 + 5)
    assert t.seqs[0] == 20000 and t.ms[0] == 2000
    t.prune(10)  # a small prefix is not worth the copy
    assert t.seqs[0] == 20000


def test_ack_latencies_count_each_message_once_by_its_publish_millisecond():
    t = TimeIndex()
    q = Queue(QueueSettings(name="q"))
    t.note(1000, 1)  # seqs 1..3 at 1000 ms
    t.note(1040, 4)  # seqs 4..  at 1040 ms
    t.count_acks(q, [1, 2, 3, 4], 1050, next_seq=6)
    assert q.ack_latency_ms == {50: 3, 10: 1}
    assert q.ack_latency_sum_ms == 3 * 50 + 10
    assert sum(q.ack_latency) == 4
    assert latency_key(137) == 130 and latency_key(4180) == 4100 and latency_key(99) == 99


# --------------------------------------------------------------------- Routes


def test_routes_are_cached_per_topic_until_a_queue_is_added():
    e = Engine([QueueSettings(name="all", topics="a.*")], auto_queues=False)
    routes = e.routes
    assert [q.name for q in routes.route("a.x")] == ["all"]
    assert "a.x" in routes.cache
    e.add_queue(QueueSettings(name="more", topics="a.x"))
    assert routes.cache == {}
    assert sorted(q.name for q in routes.route("a.x")) == ["all", "more"]
    assert routes.route_or_create("b") == []  # no auto queues: nowhere


def test_a_topic_no_queue_takes_gets_an_auto_queue_journaled_once():
    e = Engine()
    [q] = e.routes.route_or_create("jobs")
    assert q.name == "jobs" and q.settings.dead_letter == "jobs.dead"
    assert [type(r) for r in e.records] == [R.QueueDeclared]
    assert e.routes.route_or_create("jobs") == [q] and len(e.records) == 1


def test_a_queue_name_its_topics_do_not_take_is_refused_or_noticed():
    e = Engine([QueueSettings(name="jobs", topics="work")])
    with pytest.raises(ReservedNameError):
        e.routes.route_or_create("jobs")
    assert e.routes.route_or_create("jobs", strict=False) == []
    assert any("in no queue" in n for n in e.notices)
    assert e.routes.resolve_topic("jobs") == "jobs"
    e2 = Engine([QueueSettings(name="jobs", topics="work", publish_to="work")])
    assert e2.routes.resolve_topic("jobs") == "work"


def test_a_provisional_queue_is_forgotten_unused_and_kept_once_given_a_message():
    h = Harness()
    e = h.engine
    h.sub("s", "typo")
    assert "typo" in e.routes.provisional and not h.drain()
    assert not any(type(r) is R.QueueDeclared for r in h.records)
    e.unsubscribe("s", h.now)
    assert "typo" not in e.queues and not e.routes.provisional
    h.sub("t", "jobs")
    assert "jobs" in e.routes.provisional
    h.records = []
    seqs = h.pub("jobs")
    assert "jobs" not in e.routes.provisional
    assert h.drain() == {"t": seqs}
    assert [type(r) for r in h.records][0] is R.QueueDeclared and b'"jobs"' in h.records[0].settings_json


# ------------------------------------------------------------------ Admission


def test_a_batch_with_one_bad_message_journals_nothing():
    e = Engine([QueueSettings(name="jobs")])
    with pytest.raises(ProtocolError):
        e.admission.publish_many("jobs", [(b"ok", {}, None), (b"bad", {"zq.x": "1"}, None)], 5)
    with pytest.raises(LimitError):
        e.admission.publish_many("jobs", [(b"x" * 11, {}, None)], 5, max_message_bytes=10)
    assert e.next_seq == 1 and e.records == [] and e.queues["jobs"].depth == 0
    assert e.admission.publish_many("jobs", [(b"a", {}, None), (b"b", {}, None)], 5) == [1, 2]
    assert e.admission.published == 2 and e.queues["jobs"].depth == 2 and e.published == 2


def test_a_message_id_seen_in_the_window_answers_with_its_first_bookmark():
    e = Engine([QueueSettings(name="jobs", dedup_window_ms=1000)])
    adm = e.admission
    first = adm.publish_many("jobs", [(b"a", {}, "id1"), (b"b", {}, "id2"), (b"c", {}, "id1")], 10)
    assert first == [1, 2, 1] and adm.duplicates == 1  # a repeat inside the batch: its first's bookmark
    assert adm.publish_many("jobs", [(b"a", {}, "id2"), (b"d", {}, "id3")], 20) == [2, 3]
    assert adm.duplicates == 2 and e.queues["jobs"].depth == 3
    adm.end_step()  # committed now: only the journal (``find_id``, none here) would know them
    assert adm.step_ids == {}
    assert adm.publish_many("jobs", [(b"a", {}, "id1")], 30) == [4]


def test_the_dedup_port_finds_journaled_ids_only_inside_the_window():
    found = {("jobs", "old"): (7, 0), ("jobs", "recent"): (8, 950)}
    e = Engine([QueueSettings(name="jobs", dedup_window_ms=100)], next_seq=9,
               find_id=lambda topic, msg_id: found.get((topic, msg_id)))
    assert e.admission.publish_many("jobs", [(b"", {}, "old"), (b"", {}, "recent")], 1000) == [9, 8]


def test_a_reject_queue_refuses_a_whole_batch_once_full_and_the_breach_ends_once():
    h = Harness(QueueSettings(name="jobs", max_depth=2))
    adm = h.engine.admission
    h.pub("jobs", 2)
    with pytest.raises(QueueFullError):
        adm.publish_many("jobs", [(b"x", {}, None)], h.now)
    assert adm.over_limit == {"jobs"} and h.engine.queues["jobs"].overflow.rejected == 1
    assert sum("is full" in n for n in h.engine.notices) == 1
    h.sub("s", "jobs", 2)
    h.drain()
    h.engine.ack("s", [1, 2], h.now)
    h.drain()  # the step checks the breach
    assert adm.over_limit == set() and sum("back under" in n for n in h.engine.notices) == 1


def test_a_copy_is_never_refused_but_a_ring_queue_makes_room_for_it():
    h = Harness(QueueSettings(name="ring", max_depth=2, overflow="ring"))
    q = h.engine.queues["ring"]
    h.pub("ring", 2)
    h.drain()
    h.engine.admission.enqueue_copy(q, 1, 0)  # (a move's copy of bookmark 1)
    assert q.depth == 2 and q.overflow.dropped == 1


# -------------------------------------------------------------- Subscriptions


def test_subscriptions_are_found_by_id_and_by_consumer_and_end_together():
    h = Harness(QueueSettings(name="a"), QueueSettings(name="b"))
    subs = h.engine.subscriptions
    h.engine.subscribe("s1", "a", "c", 5, 0)
    h.engine.subscribe("s2", "b", "c", 5, 0)
    assert subs.subs_of_consumer == {"c": {"s1", "s2"}} and subs.subs["s2"].ordinal == 2
    with pytest.raises(ProtocolError):
        subs.subscribe("s1", "a", "c", 5, 0)
    subs.disconnect("c", 0)
    assert subs.subs == {} and subs.subs_of_consumer == {} and h.engine.subs == {}


def test_a_claim_gets_credit_for_one_answer_and_none_after_it():
    h = Harness(QueueSettings(name="jobs"))
    h.pub("jobs", 5)
    subs = h.engine.subscriptions
    subs.claim("c1", "jobs", "w", 3, 1000, h.now)
    assert h.drain() == {"c1": [1, 2, 3]}
    subs.end_claim("c1")
    h.pub("jobs")
    assert h.drain() == {}  # no credit between claims
    subs.claim("c1", "jobs", "w", 1, 1000, h.now)
    assert h.drain() == {"c1": [4]}
    with pytest.raises(ProtocolError):
        subs.claim("c1", "other", "w", 1, 1000, h.now)


# -------------------------------------------------------------------- Outputs


def test_an_expired_message_is_dead_lettered_before_its_expiry_is_journaled():
    h = Harness(QueueSettings(name="jobs", max_deliveries=1, dead_letter="jobs.dead", lease_ms=100))
    h.pub("jobs")
    h.sub("s", "jobs")
    h.drain()
    h.advance(200)  # the lease ends: deliveries ran out
    h.drain()
    kinds = [(type(r).__name__, getattr(r, "kind", None) or getattr(r, "topic", None)) for r in h.records]
    copy = kinds.index(("Message", "jobs.dead"))
    assert copy < kinds.index(("Event", R.EXPIRED))
    [m] = [r for r in h.records if type(r) is R.Message and r.topic == "jobs.dead"]
    assert m.copy_of == 1 and m.headers["zq.reason"] == R.REASON_MAX_DELIVERIES
    assert h.engine.queues["jobs.dead"].depth == 1 and h.engine.queues["jobs"].dead_lettered == 1


def test_delays_are_journaled_once_per_reason_after_their_cause():
    h = Harness(QueueSettings(name="jobs", backoff_ms=[500], backoff_jitter=0))
    h.pub("jobs", 2)
    h.sub("s", "jobs", 2)
    h.drain()
    h.engine.cancel("s", [1, 2], h.now)
    h.drain()
    kinds = [r.kind for r in h.records if type(r) is R.Event]
    assert kinds == [R.LEASED, R.CANCELLED, R.DELAYED]
    [d] = h.events(R.DELAYED)
    assert d.bookmarks == [1, 2] and d.due_ms == [500, 500] and d.reason == R.DELAY_BACKOFF
    assert h.engine.outputs.take_revokes() == []


# ------------------------------------------------------------- RecoveryPoints


def test_recovery_points_are_journaled_when_they_move_and_only_then():
    h = Harness(QueueSettings(name="jobs"))
    points = h.engine.points
    h.pub("jobs", 2)
    h.drain()  # the first step writes (due at 0)
    assert [(r.queue, r.seq) for r in h.records if type(r) is R.RecoveryPoint] == [("jobs", 1)]
    assert points.written == {"jobs": 1} and points.due_ms == limits.RECOVERY_POINT_INTERVAL_MS
    h.records = []
    points.write()  # nothing moved
    assert not [r for r in h.engine.records if type(r) is R.RecoveryPoint]
    h.sub("s", "jobs", 2)
    h.drain()
    h.engine.ack("s", [1, 2], h.now)
    points.write()
    end = h.engine.next_seq  # (past the leased event's bookmark): the queue is done with everything
    assert [(r.queue, r.seq) for r in h.engine.records if type(r) is R.RecoveryPoint] == [("jobs", end)]
    assert points.lowest() == end == h.engine.min_recovery_point()


# --------------------------------------------------------------------- Replay


def test_the_fold_counts_deliveries_and_cancels_and_forgets_finished_messages():
    q = Queue(QueueSettings(name="jobs"))
    done: set[int] = set()
    counts: dict[int, list[int]] = {}
    delays: dict[int, int] = {}
    fold_event(q, R.Event(10, 0, R.LEASED, "jobs", "c", [1, 2], [1, 1]), done, counts, delays)
    fold_event(q, R.Event(11, 0, R.CANCELLED, "jobs", "c", [2], [1]), done, counts, delays)
    fold_event(q, R.Event(12, 0, R.DELAYED, "jobs", "", [2], [1], "backoff", "", [900]), done, counts, delays)
    fold_event(q, R.Event(13, 0, R.ACKED, "jobs", "c", [1], [1]), done, counts, delays)
    assert done == {1} and counts == {1: [1, 0], 2: [1, 1]} and delays == {2: 900}


def test_a_replay_puts_back_what_is_not_done_in_order_with_its_counts():
    e = Engine([QueueSettings(name="jobs")], next_seq=5)
    load_declared(e, [R.QueueDeclared(b'{"name":"more"}', 0), R.QueueDeclared(b'{"name":"jobs","lease_ms":1}', 0)])
    assert sorted(e.queues) == ["jobs", "more"] and e.queues["jobs"].settings.lease_ms != 1  # config wins
    replay = Replay(e, e.routes, e.times)
    replay.fold_events([R.Event(3, 0, R.LEASED, "jobs", "c", [1, 2], [1, 1]), R.Event(4, 0, R.ACKED, "jobs", "c", [1], [1])])
    replay.replay([R.Message(1, 100, "jobs", {}, b"a"), R.Message(2, 100, "jobs", {}, b"b"),
                   R.Message(3, 101, "more", {}, b"c")], {"more": 3})
    written: dict[str, int] = {}
    replay.finish({"more": 3}, written)
    q = e.queues["jobs"]
    assert list(inventory.waiting(q)) == [2] and q.deliveries_of(2) == 1
    assert list(inventory.waiting(e.queues["more"])) == [3]
    assert written == {"jobs": -1, "more": 3} and list(e.times.ms) == [100, 101]


# ---------------------------------------------------------------------- Views


def test_stats_with_a_limit_report_the_queues_holding_most():
    h = Harness(QueueSettings(name="a"), QueueSettings(name="b"), QueueSettings(name="c"))
    h.pub("a", 1)
    h.pub("b", 3)
    h.pub("c", 2)
    views = h.engine.views
    s = views.stats(limit=2)
    assert sorted(s["queues"]) == ["b", "c"] and s["queues_total"] == 3 and s["published"] == 6
    assert sorted(views.stats(names=["c", "zz"], sees=lambda n: n != "b")["queues"]) == ["c"]


def test_peek_and_query_read_waiting_messages_without_leasing_them():
    h = Harness(QueueSettings(name="jobs"))
    h.pub("jobs", 2, kind="x")
    h.pub("jobs", 1, kind="y")
    h.drain()  # journaled: the content port reads them
    views = h.engine.views
    assert views.peek("jobs", 10) == [(1, 0), (2, 0), (3, 0)]
    assert views.peek("jobs", 10, filter="kind = 'y'") == [(3, 0)]
    assert views.peek("jobs", 1) == [(1, 0)]
    rows = views.query("jobs", ["kind"], ["count"])["rows"]
    assert [(r["kind"], r["count"]) for r in rows] == [("x", 2), ("y", 1)]
    h.now = 250
    h.engine.set_time(250)
    assert views.oldest_waiting_ms(h.engine.queues["jobs"]) == 250
    assert h.engine.queues["jobs"].depth == 3 and not h.engine.queues["jobs"].lease_of
