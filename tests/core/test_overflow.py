"""Overflow policies: max_depth / max_bytes with reject, ring and flow-control."""

import pytest

from zq.core import QueueSettings
from zq.core import records as R
from zq.core.errors import QueueFullError
from zq.journal.base import recover_engine
from zq.journal.memory_journal import MemoryJournal

from .helpers import Harness


def test_reject_refuses_the_whole_batch_before_anything_is_journaled():
    h = Harness(QueueSettings(name="jobs", max_depth=3))
    h.pub("jobs", 2)
    h.drain()
    with pytest.raises(QueueFullError, match="full"):
        h.engine.publish_many("jobs", [(b"a", {}, None), (b"b", {}, None)], h.now)
    assert not [r for r in h.engine.drain(h.now).records if type(r) is R.Message]
    assert h.engine.queues["jobs"].depth == 2
    h.pub("jobs", 1)  # exactly to the limit is fine
    st = h.engine.stats()["queues"]["jobs"]["overflow"]
    assert st["rejected"] == 2 and st["breaches"] == 1 and st["over"] is False  # the breach ended at the drain
    assert any("is full" in n for n in h.engine.notices)


def test_leased_messages_count_and_an_ack_makes_room():
    h = Harness(QueueSettings(name="jobs", max_depth=2))
    seqs = h.pub("jobs", 2)
    h.sub("w", "jobs", backlog=2)
    h.drain()
    with pytest.raises(QueueFullError):
        h.pub("jobs")
    h.engine.ack("w", seqs[:1], h.now)
    h.drain()
    assert h.engine.queues["jobs"].overflow.blocked is False  # the breach ended, once
    assert h.pub("jobs")


def test_ring_drops_the_oldest_available_and_dead_letters_it_with_reason_overflow():
    h = Harness(QueueSettings(name="ticks", max_depth=3, overflow="ring", dead_letter="ticks.dead"))
    seqs = h.pub("ticks", 5)
    h.drain()
    assert [s for s, _ in h.engine.peek("ticks", 10)] == seqs[2:]
    expired = [e for e in h.events(R.EXPIRED) if e.queue == "ticks"]
    assert [b for e in expired for b in e.bookmarks] == seqs[:2] and expired[0].reason == "overflow"
    assert h.engine.queues["ticks.dead"].depth == 2
    assert h.engine.stats()["queues"]["ticks"]["overflow"]["dropped"] == 2


def test_max_bytes_counts_payload_bytes_and_survives_recovery():
    journal = MemoryJournal()
    settings = [QueueSettings(name="blobs", max_bytes=100, overflow="ring")]
    e = recover_engine(journal, settings)
    for _ in range(3):
        e.publish("blobs", b"x" * 40, {}, 0)
    journal.append(e.drain(0).records)
    journal.commit(0)
    q = e.queues["blobs"]
    assert q.depth == 2 and q.overflow.bytes == 80  # the first was dropped to fit
    again = recover_engine(journal, settings)
    assert again.queues["blobs"].overflow.bytes == 80 and again.queues["blobs"].depth == 2


def test_flow_control_withholds_until_below_the_resume_threshold():
    h = Harness(QueueSettings(name="jobs", max_depth=4, overflow="flow-control", resume_percent=50))
    seqs = h.pub("jobs", 5)  # never refused: the message is kept
    assert h.engine.withheld("jobs") == ["jobs"]
    h.sub("w", "jobs", backlog=5)
    h.drain()
    h.engine.ack("w", seqs[:2], h.now)
    h.drain()
    assert h.engine.withheld("jobs") == ["jobs"]  # 3 of 4 is above 50 %
    h.engine.ack("w", seqs[2:4], h.now)
    h.drain()
    assert h.engine.withheld("jobs") == []
    assert [n for n in h.engine.notices if "back under" in n]


def test_bad_overflow_settings_name_the_key():
    from zq.core.errors import ConfigError

    with pytest.raises(ConfigError, match="overflow"):
        QueueSettings(name="q", overflow="spill").validate()
