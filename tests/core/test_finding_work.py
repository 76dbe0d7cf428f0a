"""A step finds its work instead of searching every queue for it (``Engine.touch``,
``Engine.schedule``): the queues something touched and those whose deadline came are
visited; the others cost the step nothing, yet their leases, delays and expiries still
happen on time. (Ten thousand idle queues once cost every step ~9 ms.)"""

from zq.core import QueueSettings
from zq.core import records as R
from zq.core.limits import EXPIRY_SWEEP_INTERVAL_MS

from .helpers import Harness

IDLE = 2_000


def many(**busy) -> Harness:
    busy.setdefault("lease_ms", 1000)
    h = Harness(QueueSettings(name="busy", **busy),
                *(QueueSettings(name=f"idle{i}", max_per_subscription_backlog=4) for i in range(IDLE)))
    h.advance(1)
    h.drain()  # every queue is visited once, when it is made
    return h


def visited(h: Harness) -> list[str]:
    """The queues the last advance looked at."""
    return [q.name for q in h.engine.queues.values() if q.advanced_ms == h.now]


def test_a_step_visits_only_the_queue_a_publish_touched():
    h = many()
    h.sub("w", "busy", 4)
    h.advance(5)
    [a] = h.pub("busy")
    h.advance(0)
    assert h.drain() == {"w": [a]}
    assert visited(h) == ["busy"]
    h.advance(5)
    h.drain()
    assert visited(h) == []  # nothing touched, nothing due: no queue looked at
    assert h.engine.touched == []


def test_idle_queues_with_subscribers_and_messages_are_not_visited():
    h = many()
    for i in range(0, IDLE, 100):
        h.pub(f"idle{i}", 3)
        h.sub(f"s{i}", f"idle{i}", 1)
    h.advance(1)
    h.drain()
    h.advance(5)
    h.pub("busy")
    h.advance(0)
    h.drain()
    assert visited(h) == ["busy"]


def test_an_idle_queues_lease_expires_on_time_and_its_deadline_is_the_engines():
    h = many(lease_ms=300)
    h.sub("w", "busy", 1)
    [a] = h.pub("busy")
    h.advance(0)
    assert h.drain() == {"w": [a]}
    assert h.engine.next_deadline_ms() == h.now + 300
    h.advance(299)
    h.drain()
    assert not h.events(R.LEASE_EXPIRED)
    h.advance(1)
    assert visited(h) == ["busy"]
    assert h.drain() == {"w": [a]}  # expired, and delivered again
    assert [e.bookmarks for e in h.events(R.LEASE_EXPIRED)] == [[a]]


def test_a_delayed_message_wakes_on_an_otherwise_idle_engine():
    h = many()
    h.sub("w", "busy", 1)
    a = h.engine.publish("busy", b"m", {}, h.now, not_before_ms=h.now + 250)
    h.advance(0)
    assert h.drain() == {}
    assert h.engine.next_deadline_ms() == h.now + 250
    h.advance(250)
    assert h.drain() == {"w": [a]}


def test_a_message_too_old_expires_without_anything_touching_its_queue():
    h = many(expiration_ms=500)
    [a] = h.pub("busy")
    h.advance(0)
    h.drain()
    due = h.engine.next_deadline_ms()
    assert due is not None and due <= h.now + 500
    h.advance(500 + EXPIRY_SWEEP_INTERVAL_MS)
    h.drain()
    assert [e.bookmarks for e in h.events(R.EXPIRED)] == [[a]]


def test_a_sooner_deadline_replaces_a_later_one_and_stale_entries_are_skipped():
    h = many(lease_ms=10_000)
    h.sub("w", "busy", 2)
    [a] = h.pub("busy")
    h.advance(0)
    h.drain()
    assert h.engine.next_deadline_ms() == h.now + 10_000
    h.engine.settle("extend", "w", [a], None, h.now, extra_ms=100)  # sooner than the lease it had
    h.drain()
    assert h.engine.next_deadline_ms() == h.now + 100
    h.engine.settle("ack", "w", [a], None, h.now)
    h.drain()
    h.advance(100)  # the entry comes due: the queue is looked at, finds nothing, and is left alone
    h.drain()
    assert h.engine.next_deadline_ms() is None
    assert h.engine.deadlines == []


def test_a_deleted_queue_in_the_heap_is_skipped_and_a_new_one_of_its_name_is_its_own():
    h = Harness(QueueSettings(name="other"))
    assert h.engine.declare_queue(QueueSettings(name="jobs", lease_ms=200), lambda name: False)
    h.sub("w", "jobs", 1)
    [a] = h.pub("jobs")
    h.drain()
    h.engine.delete_queue("jobs", lambda name: False, h.now)
    h.drain()
    assert h.engine.declare_queue(QueueSettings(name="jobs", lease_ms=5000), lambda name: False)
    h.drain()
    h.advance(200)  # the old queue's lease deadline: nothing of it is left to expire
    h.drain()
    assert not h.events(R.LEASE_EXPIRED)
    assert h.engine.next_deadline_ms() is None


def test_dead_letters_reach_a_queue_nothing_else_touched():
    h = Harness(QueueSettings(name="jobs", lease_ms=100, max_deliveries=1, dead_letter="jobs.dead"),
                *(QueueSettings(name=f"idle{i}") for i in range(50)), QueueSettings(name="jobs.dead"))
    h.sub("w", "jobs", 1)
    h.sub("d", "jobs.dead", 1)
    [a] = h.pub("jobs")
    assert h.drain() == {"w": [a]}
    h.advance(100)
    got = h.drain()
    assert list(got) == ["d"] and len(got["d"]) == 1  # the copy, delivered in the step it was made
