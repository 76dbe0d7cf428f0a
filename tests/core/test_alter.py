"""Queues can change: alter what can change on a live queue, journaled; declare again
with the same settings succeeds, with others is refused naming the differences."""

import pytest

from zq.core import QueueSettings
from zq.core import records as R
from zq.core.errors import ConfigError, ProtocolError, QueueExistsError, UnknownQueueError
from zq.core.manage import ALTERABLE
from zq.core.settings import DEFAULT_BACKOFF_MS, auto_queue, default_dead_letter
from zq.journal.base import recover_engine
from zq.journal.memory_journal import MemoryJournal

from .helpers import Harness

RUNTIME = {"jobs"}.__contains__
NONE = set().__contains__


def runtime_queue(h: Harness, **kw) -> None:
    h.engine.declare_queue(QueueSettings(name="jobs", **kw), NONE)


def test_alter_changes_the_retry_schedule_of_a_live_queue_and_journals_it():
    h = Harness(auto_queues=False)
    runtime_queue(h, lease_ms=1000)
    [a] = h.pub("jobs")
    h.sub("w", "jobs", 1)
    assert h.drain() == {"w": [a]}
    changed = h.engine.alter_queue("jobs", {"backoff_ms": [5000], "backoff_jitter": 0.0}, NONE)
    assert changed == ["backoff_ms: [] -> [5000]", "backoff_jitter: 0.1 -> 0.0"]
    assert h.engine.settle("cancel", "w", [a], [1], h.now) == {}
    h.advance(4999)
    assert h.drain() == {}  # the new schedule applies to this retry
    h.advance(1)
    assert h.drain() == {"w": [a]}
    declared = [r for r in h.records if type(r) is R.QueueDeclared]
    assert len(declared) == 2  # the declare, then the alter


def test_a_shorter_lease_applies_to_new_deliveries_and_old_leases_still_expire_in_order():
    h = Harness(auto_queues=False)
    runtime_queue(h, lease_ms=10_000)
    a, b = h.pub("jobs", 2)
    h.sub("w", "jobs", 1)
    assert h.drain() == {"w": [a]}
    h.engine.alter_queue("jobs", {"lease_ms": 1000}, NONE)
    h.sub("v", "jobs", 1)
    assert h.drain() == {"v": [b]}  # leased with 1 s, after a's 10 s lease
    h.advance(1000)
    h.drain()
    assert [e.bookmarks for e in h.events(R.LEASE_EXPIRED)] == [[b]]  # not held up behind a's later deadline
    h.advance(8999)
    h.drain()
    assert [a] not in [e.bookmarks for e in h.events(R.LEASE_EXPIRED)]  # a keeps the deadline it was given
    h.advance(1)
    h.drain()
    assert [a] in [e.bookmarks for e in h.events(R.LEASE_EXPIRED)]


def test_raising_max_deliveries_keeps_a_message_that_would_have_been_dead_lettered():
    h = Harness(auto_queues=False)
    runtime_queue(h, lease_ms=100, max_deliveries=1)
    [a] = h.pub("jobs")
    h.sub("w", "jobs", 1)
    h.drain()
    h.engine.alter_queue("jobs", {"max_deliveries": 5}, NONE)
    h.advance(100)
    assert h.drain() == {"w": [a]}
    assert not h.events(R.EXPIRED)


def test_limits_and_fairness_and_dead_letter_change():
    h = Harness(auto_queues=False)
    runtime_queue(h, max_depth=10, overflow="reject")
    q = h.engine.queues["jobs"]
    h.engine.alter_queue("jobs", {"max_depth": 2, "fairness": "round-robin", "dead_letter": "jobs.dead"}, NONE)
    assert (q.settings.max_depth, q.fairness, q.settings.dead_letter) == (2, "round-robin", "jobs.dead")
    h.pub("jobs", 2)
    with pytest.raises(Exception, match="max_depth|full"):
        h.pub("jobs")


def test_what_cannot_change_is_refused_saying_why():
    h = Harness(auto_queues=False)
    runtime_queue(h)
    for key, value in [("topics", "x.*"), ("semantics", "at-most-once"), ("group_header", "g"), ("filter", "a = 1"),
                       ("priority", "/p"), ("lvq_key", "k"), ("browse_only", True), ("tenant_header", "t")]:
        with pytest.raises(ProtocolError, match=f"{key} cannot change on a live queue: it decides which messages"):
            h.engine.alter_queue("jobs", {key: value}, NONE)
    with pytest.raises(ProtocolError, match="max_bytes can change between limits but not be turned on"):
        h.engine.alter_queue("jobs", {"max_bytes": 1024}, NONE)
    with pytest.raises(ConfigError, match="tenant weights need tenant_header"):
        h.engine.alter_queue("jobs", {"tenant_weights": {"a": 2}}, NONE)
    assert "topics" not in ALTERABLE and "lease_ms" in ALTERABLE


def test_bad_values_unknown_queues_and_config_queues_are_refused():
    h = Harness(QueueSettings(name="fixed"), auto_queues=False)
    runtime_queue(h)
    with pytest.raises(ConfigError, match="defined in the config file"):
        h.engine.alter_queue("fixed", {"lease_ms": 5}, {"fixed"}.__contains__)
    with pytest.raises(UnknownQueueError):
        h.engine.alter_queue("nosuch", {"lease_ms": 5}, NONE)
    for changes in ({"lease_ms": -1}, {"lease_ms": 1 << 70}, {"max_deliveries": -3}, {"backoff_jitter": 7.0},
                    {"backoff_ms": [1] * 10_000}, {"fairness": "whoever"}, {"overflow": "x" * 100_000},
                    {"dead_letter": ""}, {"lease_ms": "5s"}):
        with pytest.raises((ConfigError, ProtocolError)):
            h.engine.alter_queue("jobs", changes, NONE)
    assert h.engine.queues["jobs"].settings == QueueSettings(name="jobs", start_seq=h.engine.queues["jobs"].settings.start_seq)


def test_an_alter_that_changes_nothing_journals_nothing():
    h = Harness(auto_queues=False)
    runtime_queue(h, lease_ms=5000)
    h.drain()
    h.records.clear()
    assert h.engine.alter_queue("jobs", {"lease_ms": 5000}, NONE) == []
    h.drain()
    assert not [r for r in h.records if type(r) is R.QueueDeclared]


def test_an_altered_queue_keeps_its_settings_across_a_restart_with_its_messages():
    journal = MemoryJournal()
    e = recover_engine(journal, [])
    e.declare_queue(QueueSettings(name="jobs", lease_ms=1000), NONE)
    e.publish("jobs", b"x", {}, 0)
    e.alter_queue("jobs", {"lease_ms": 7000, "backoff_ms": [2000]}, NONE)
    journal.append(e.drain(0).records)
    journal.commit(0)
    again = recover_engine(journal, [])
    q = again.queues["jobs"]
    assert (q.settings.lease_ms, q.settings.backoff_ms, q.depth) == (7000, [2000], 1)
    assert q.settings.start_seq == e.queues["jobs"].settings.start_seq  # the queue's own start is kept


def test_declaring_an_auto_created_queue_with_its_own_defaults_succeeds():
    h = Harness()
    h.pub("orders")
    q = h.engine.queues["orders"]
    assert q.settings.backoff_ms == DEFAULT_BACKOFF_MS and q.settings.dead_letter == "orders.dead"
    same = auto_queue("orders", 0)
    assert h.engine.declare_queue(same, NONE) is False
    with pytest.raises(QueueExistsError, match=r"exists \(at run time\) with other settings: max_deliveries: 20 -> 3"):
        h.engine.declare_queue(auto_queue("orders", 0).__replace__(max_deliveries=3)
                               if hasattr(QueueSettings, "__replace__") else
                               QueueSettings(name="orders", dead_letter="orders.dead", backoff_ms=DEFAULT_BACKOFF_MS,
                                             max_deliveries=3), NONE)


def test_the_default_dead_letter_is_not_a_chain_nor_taken_back_in():
    assert default_dead_letter("orders") == "orders.dead"
    assert default_dead_letter("orders.dead") is None  # a dead-letter queue has none of its own
    assert default_dead_letter("orders", r"orders\..*") is None  # its own topics would take its dead letters
    assert default_dead_letter("o" * 1022) is None  # no room for the suffix in a topic
