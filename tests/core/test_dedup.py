"""Deduplication by message id: within the window a repeat enqueues nothing and
returns the first publish's bookmark, across restarts too (the journal keeps ids)."""

from zq.core import QueueSettings
from zq.core.engine import Engine
from zq.journal.base import recover_engine
from zq.journal.lmdb_journal import LmdbJournal
from zq.journal.memory_journal import MemoryJournal


def engine_on(journal, *queues):  # type: ignore[no-untyped-def]
    return Engine(queues, content=journal.get_message, find_id=journal.find_id)


def step(engine, journal, now):  # type: ignore[no-untyped-def]
    journal.append(engine.drain(now).records)
    journal.commit(now)


def test_a_topic_no_queue_covers_dedups_with_the_default_window():
    """With auto_queues off, a topic nobody covers is journaled all the same: a repeated
    id there used to raise TypeError (the window's default read a struct's descriptor)."""
    j = MemoryJournal()
    e = Engine(auto_queues=False, content=j.get_message, find_id=j.find_id)
    first = e.publish("audit", b"a", {}, 0, msg_id="order-1")
    step(e, j, 0)
    assert e.publish("audit", b"again", {}, 1, msg_id="order-1") == first
    assert e.publish("audit", b"later", {}, 86_400_001, msg_id="order-1") != first  # past the window: new


def test_a_repeat_in_the_same_step_or_batch_returns_the_first_bookmark():
    j = MemoryJournal()
    e = engine_on(j)
    first = e.publish("jobs", b"a", {}, 0, msg_id="order-1")
    assert e.publish("jobs", b"again", {}, 0, msg_id="order-1") == first
    batch = e.publish_many("jobs", [(b"x", {}, "id-x"), (b"y", {}, None), (b"x2", {}, "id-x"), (b"z", {}, "order-1")], 0)
    assert batch[2] == batch[0] and batch[3] == first and len(set(batch[:2])) == 2
    assert e.queues["jobs"].depth == 3
    step(e, j, 0)
    assert e.stats()["duplicates"] == 3


def test_a_repeat_after_commit_is_found_in_the_journal_until_the_window_ends():
    j = MemoryJournal()
    e = engine_on(j, QueueSettings(name="jobs", dedup_window_ms=1000))
    first = e.publish("jobs", b"a", {}, 0, msg_id="k")
    step(e, j, 0)
    assert e.publish("jobs", b"a", {}, 1000, msg_id="k") == first
    assert e.publish("jobs", b"a", {}, 1001, msg_id="k") != first  # window passed: a new message
    assert e.queues["jobs"].depth == 2


def test_ids_are_per_topic_and_a_zero_window_turns_dedup_off():
    j = MemoryJournal()
    e = engine_on(j, QueueSettings(name="raw", dedup_window_ms=0))
    assert e.publish("a", b"", {}, 0, msg_id="k") != e.publish("b", b"", {}, 0, msg_id="k")
    assert e.publish("raw", b"", {}, 0, msg_id="k") != e.publish("raw", b"", {}, 0, msg_id="k")


def test_dedup_survives_a_restart_from_the_lmdb_journal(tmp_path):
    j = LmdbJournal(str(tmp_path / "j"))
    e = recover_engine(j, [])
    first = e.publish("jobs", b"a", {}, 10, msg_id="order-9")
    long_id = "x" * 600  # longer than an LMDB key: stored by hash
    other = e.publish("jobs", b"b", {}, 10, msg_id=long_id)
    step(e, j, 10)
    j.close()
    j = LmdbJournal(str(tmp_path / "j"))
    again = recover_engine(j, [])
    assert again.publish("jobs", b"a", {}, 20, msg_id="order-9") == first
    assert again.publish("jobs", b"b", {}, 20, msg_id=long_id) == other
    assert again.queues["jobs"].depth == 2
    j.close()
