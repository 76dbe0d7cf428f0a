"""Auto-created queues: a consumer of a name that another queue covers is told where its
messages go; a queue a consumer created stays only once a message enters it."""

import pytest

from zq.core import QueueSettings
from zq.core import records as R
from zq.core.errors import UnknownQueueError
from zq.journal.base import recover_engine
from zq.journal.memory_journal import MemoryJournal

from .helpers import Harness

NONE = set().__contains__


def declared(h: Harness) -> list:
    return [r for r in h.records if type(r) is R.QueueDeclared]


def test_consuming_a_topic_that_a_queue_covers_says_which_queue_and_creates_nothing():
    h = Harness(QueueSettings(name="orders", topics=r"orders\..*"))
    with pytest.raises(UnknownQueueError, match=r"messages on topic 'orders.eu' go to queue 'orders' .*consume 'orders'"):
        h.sub("w", "orders.eu")
    assert "orders.eu" not in h.engine.queues
    h.engine.declare_queue(QueueSettings(name="orders.eu"), NONE)  # an explicit create still can
    h.sub("w", "orders.eu")
    [m] = h.pub("orders.eu")
    got = h.drain()
    assert got == {"w": [m]} and h.engine.queues["orders"].depth == 1  # (each queue has its copy: asked for)


def test_a_typo_consumer_leaves_no_queue_behind():
    h = Harness()
    h.sub("w", "jbos")
    assert "jbos" in h.engine.queues
    h.drain()
    assert declared(h) == []  # not journaled: a restart would not bring it back
    h.engine.unsubscribe("w", h.now)
    assert "jbos" not in h.engine.queues


def test_a_consumer_waiting_for_its_first_message_gets_it_and_then_the_queue_stays():
    journal = MemoryJournal()
    h = Harness()
    h.sub("w", "jobs")
    [a] = h.pub("jobs")
    assert h.commit_to(journal) == {"w": [a]}
    h.engine.unsubscribe("w", h.now)
    assert "jobs" in h.engine.queues  # a message entered it: it is a queue like any other now
    again = recover_engine(journal, [])
    assert "jobs" in again.queues and again.queues["jobs"].depth == 1  # (the lease ended with the restart)


def test_an_explicit_declare_of_a_queue_a_consumer_created_keeps_it():
    h = Harness()
    h.sub("w", "jobs")
    assert h.engine.declare_queue(h.engine.queues["jobs"].settings, NONE) is False  # same settings: no error
    h.engine.unsubscribe("w", h.now)
    h.drain()
    assert "jobs" in h.engine.queues and len(declared(h)) == 1


def test_a_claim_on_an_unknown_name_is_provisional_too():
    h = Harness()
    h.engine.claim("c", "nothing-here", "c", 1, 1000, h.now)
    h.drain()
    h.engine.end_claim("c")
    h.engine.unsubscribe("c", h.now)
    assert "nothing-here" not in h.engine.queues and declared(h) == []
