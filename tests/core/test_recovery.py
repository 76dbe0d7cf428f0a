"""Recovery is a pure fold over journal records: rebuild, then compare."""

from zq.core import QueueSettings
from zq.core import records as R
from zq.journal.base import recover_engine
from zq.journal.memory_journal import MemoryJournal

from .helpers import Harness




def restart(journal: MemoryJournal, *queues: QueueSettings) -> Harness:
    h = Harness()
    h.engine = recover_engine(journal, queues)
    return h


def test_acked_messages_are_never_redelivered_and_unacked_ones_come_back_with_counts():
    settings = QueueSettings(name="jobs", max_per_subscription_backlog=10, lease_ms=10**6)
    j = MemoryJournal()
    h = Harness(settings)
    a, b, c = h.pub("jobs", 3)
    h.sub("s", "jobs", 10)
    h.commit_to(j)
    h.engine.ack("s", [a], h.now)
    h.engine.cancel("s", [b], h.now)
    h.commit_to(j)  # b redelivered (2nd delivery), c still leased from the first
    h2 = restart(j, settings)
    h2.sub("t", "jobs", 10)
    assert h2.drain() == {"t": [b, c]}
    q = h2.engine.queues["jobs"]
    assert (q.deliveries_of(b), q.cancels_of(b), q.deliveries_of(c)) == (3, 1, 2)


def test_uncommitted_work_is_lost_but_committed_work_is_not():
    settings = QueueSettings(name="jobs", lease_ms=10**6)
    j = MemoryJournal()
    h = Harness(settings)
    a = h.pub("jobs")[0]
    h.sub("s", "jobs")
    h.commit_to(j)
    h.engine.ack("s", [a], h.now)
    h.pub("jobs")  # never committed: the publisher never got a confirmation
    h.drain()
    j.append(h.records)
    j.crash()
    h2 = restart(j, settings)
    h2.sub("t", "jobs")
    assert h2.drain() == {"t": [a]}  # the ack was not durable: at-least-once redelivers


def test_group_order_and_auto_created_queues_survive_a_restart():
    j = MemoryJournal()
    h = Harness()
    seqs = [h.pub("orders", group="A")[0] for _ in range(3)]
    h.sub("s", "orders", 10)
    h.commit_to(j)
    h2 = restart(j)
    assert "orders" in h2.engine.queues
    h2.sub("t", "orders", 2)
    assert h2.drain() == {"t": seqs[:2]}  # the holder takes the group up to its credit, in order
    h2.sub("u", "orders", 10)
    assert h2.drain() == {}  # t holds A: u gets none of it
    h2.engine.ack("t", seqs[:2], 0)
    assert h2.drain() in ({"t": [seqs[2]]}, {"u": [seqs[2]]})


def test_recovery_reads_from_the_recovery_point_not_the_start():
    settings = QueueSettings(name="jobs", max_per_subscription_backlog=100)
    j = MemoryJournal()
    h = Harness(settings)
    seqs = h.pub("jobs", 50)
    h.sub("s", "jobs", 100)
    h.commit_to(j)
    h.engine.ack("s", seqs[:40], h.now)
    h.now += 5000  # past the recovery-point interval
    h.commit_to(j)
    assert j.recovery_points()["jobs"] == seqs[40]
    read = []
    original = j.read_messages
    j.read_messages = lambda start: (read.append(start), original(start))[1]
    h2 = restart(j, settings)
    assert read == [seqs[40]]
    assert h2.engine.queues["jobs"].depth == 10


def test_at_most_once_deliveries_are_gone_after_a_restart():
    settings = QueueSettings(name="jobs", semantics="at-most-once")
    j = MemoryJournal()
    h = Harness(settings)
    a, b = h.pub("jobs", 2)
    h.sub("s", "jobs", 1)
    h.commit_to(j)
    h2 = restart(j, settings)
    h2.sub("t", "jobs", 5)
    assert h2.drain() == {"t": [b]}


def test_a_message_out_of_deliveries_at_the_crash_expires_on_recovery():
    settings = QueueSettings(name="jobs", max_deliveries=1, dead_letter="dlq")
    j = MemoryJournal()
    h = Harness(settings)
    a = h.pub("jobs")[0]
    h.sub("s", "jobs")
    h.commit_to(j)
    h2 = restart(j, settings)
    out = h2.engine.drain(0)
    expired = [(e.kind, e.reason, e.bookmarks) for e in out.records if isinstance(e, R.Event)]
    # the delivery the crash cut is journaled as its consumer gone, then the expiry it caused
    assert expired == [(R.RETURNED, R.RETURN_RESTART, [a]), (R.EXPIRED, R.REASON_MAX_DELIVERIES, [a])]
    assert h2.engine.queues["jobs"].depth == 0
    assert h2.engine.queues["dlq"].depth == 1
